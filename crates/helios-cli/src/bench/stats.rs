// Summary statistics of repeated timings: median, p95, coefficient of variation.
//
// Key decision: percentiles interpolate linearly between the two nearest order statistics
// (NumPy's default), and the CV uses the sample standard deviation (n - 1), so that
// `bench/torch_reference.py`, which computes the same three figures, reports comparable
// numbers from the same kind of samples.

use serde::Serialize;

/// Statistics of one set of samples, all in the samples' unit (µs in this module's callers).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub samples: usize,
    pub median: f64,
    pub p95: f64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// Standard deviation over mean; 0 for a single sample or a zero mean.
    pub cv: f64,
}

impl Summary {
    /// The summary of `values`, or `None` when there are none or one is not finite.
    pub fn of(values: &[f64]) -> Option<Summary> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let cv = if n > 1 && mean != 0.0 {
            let var = sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            var.sqrt() / mean.abs()
        } else {
            0.0
        };
        Some(Summary {
            samples: n,
            median: percentile_sorted(&sorted, 50.0),
            p95: percentile_sorted(&sorted, 95.0),
            mean,
            min: sorted[0],
            max: sorted[n - 1],
            cv,
        })
    }
}

/// The `p`-th percentile (0..=100) of ascending `sorted`, interpolating linearly.
fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    debug_assert!(!sorted.is_empty());
    let rank = p.clamp(0.0, 100.0) / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    sorted[lo] + (sorted[hi] - sorted[lo]) * frac
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn empty_and_non_finite_have_no_summary() {
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
        assert!(Summary::of(&[f64::INFINITY]).is_none());
    }

    #[test]
    fn single_sample() {
        let s = Summary::of(&[3.5]).unwrap();
        assert_eq!(
            (s.median, s.p95, s.min, s.max, s.cv),
            (3.5, 3.5, 3.5, 3.5, 0.0)
        );
    }

    #[test]
    fn median_odd_and_even_order_independent() {
        assert_eq!(Summary::of(&[5.0, 1.0, 3.0]).unwrap().median, 3.0);
        assert_eq!(Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap().median, 2.5);
    }

    #[test]
    fn p95_interpolates_like_numpy() {
        // numpy.percentile(range(1, 101), 95) == 95.05
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v).unwrap();
        assert!(close(s.p95, 95.05), "{}", s.p95);
        assert!(close(s.median, 50.5));
        // numpy.percentile([1, 2, 3, 4, 10], 95) == 8.8
        assert!(close(
            Summary::of(&[10.0, 1.0, 2.0, 3.0, 4.0]).unwrap().p95,
            8.8
        ));
    }

    #[test]
    fn cv_uses_sample_standard_deviation() {
        // mean 5, sample variance 32/7 for [2, 4, 4, 4, 5, 5, 7, 9]
        let s = Summary::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert!(close(s.mean, 5.0));
        assert!(close(s.cv, (32.0f64 / 7.0).sqrt() / 5.0), "{}", s.cv);
        assert_eq!(Summary::of(&[2.0, 2.0, 2.0]).unwrap().cv, 0.0);
        assert_eq!(Summary::of(&[0.0, 0.0]).unwrap().cv, 0.0);
    }
}
