// The loss curve of a training run as a PNG (plotters, pure-Rust bitmap backend): training
// loss per step and validation loss at each evaluation.
//
// plotters draws text through a font it is given (no system font library, so no C
// dependencies): the first of a few common TrueType fonts found on the machine. Without
// one the curves are drawn alone: no captions, no axes (plotters 0.3.7 loops forever
// computing key points for an axis asked for zero labels, so the mesh is left out).

use std::path::Path;

use helios_nn::History;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Registers a font for plotters' text; false when none is found.
fn font() -> bool {
    for path in FONTS {
        if let Ok(bytes) = std::fs::read(path) {
            // plotters keeps the bytes for the rest of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

/// Draws `h` into `path` (800x500 PNG).
pub fn loss_curve(path: &Path, h: &History) -> Result<(), Box<dyn std::error::Error>> {
    draw(path, h, font())
}

/// `loss_curve`, with captions, axes and a legend when `text` (a font is registered).
fn draw(path: &Path, h: &History, text: bool) -> Result<(), Box<dyn std::error::Error>> {
    if h.train.is_empty() {
        return Err("no steps to plot".into());
    }
    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let last = h.train.last().map_or(1, |s| s.step).max(1);
    let losses = h
        .train
        .iter()
        .map(|s| s.loss)
        .chain(h.val.iter().map(|v| v.loss))
        .filter(|l| l.is_finite());
    let (lo, hi) = losses.fold((f32::MAX, f32::MIN), |(a, b), l| (a.min(l), b.max(l)));
    let pad = ((hi - lo) * 0.05).max(0.01);
    let mut builder = ChartBuilder::on(&root);
    builder.margin(15);
    if text {
        builder
            .caption("Helios GPT-2 training loss", ("sans-serif", 22))
            .x_label_area_size(40)
            .y_label_area_size(55);
    }
    let mut chart = builder.build_cartesian_2d(0u64..last, (lo - pad)..(hi + pad))?;
    if text {
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("cross-entropy loss")
            .draw()?;
    }
    let train = chart.draw_series(LineSeries::new(
        h.train.iter().map(|s| (s.step, s.loss)),
        &BLUE,
    ))?;
    if text {
        train
            .label("train")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE));
    }
    if !h.val.is_empty() {
        let val = chart.draw_series(LineSeries::new(
            h.val.iter().map(|v| (v.step, v.loss)),
            RED.stroke_width(2),
        ))?;
        if text {
            val.label("validation")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED));
        }
        chart.draw_series(
            h.val
                .iter()
                .map(|v| Circle::new((v.step, v.loss), 3, RED.filled())),
        )?;
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use helios_nn::train::{EvalLog, StepLog};

    fn history() -> History {
        let step = |step: u64, loss: f32| StepLog {
            step,
            loss,
            lr: 1e-3,
            grad_norm: 1.0,
            fwd_ms: 1.0,
            bwd_ms: 1.0,
            opt_ms: 1.0,
            tokens: 64,
            loss_scale: None,
            skipped: false,
        };
        History {
            train: (1..=20).map(|i| step(i, 10.0 / i as f32)).collect(),
            val: vec![EvalLog {
                step: 10,
                loss: 1.5,
            }],
        }
    }

    /// With and without a font the curve is drawn, in bounded time (without one, plotters
    /// once looped forever on an axis of zero labels: a machine without fonts hung at the
    /// end of `helios train`).
    #[test]
    fn curves_are_drawn_with_and_without_a_font() {
        let dir = std::env::temp_dir().join(format!("helios-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for text in [false, font()] {
            let path = dir.join(format!("loss-{text}.png"));
            let (tx, rx) = std::sync::mpsc::channel();
            let p = path.clone();
            std::thread::spawn(move || {
                let _ = tx.send(draw(&p, &history(), text).map_err(|e| e.to_string()));
            });
            let drawn = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("the curve is drawn within a minute");
            drawn.unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() > 1000);
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
