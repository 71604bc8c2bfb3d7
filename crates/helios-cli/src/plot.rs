// The loss curve of a training run as a PNG (plotters, pure-Rust bitmap backend): training
// loss per step and validation loss at each evaluation.
//
// Text (title, axis labels, tick numbers, legend) is drawn with a font the binary carries,
// Open Sans Regular (Apache License 2.0; `assets/README.md` says where the file comes from,
// `assets/OpenSans-LICENSE.txt` is its licence), so the picture is the same on a server or in
// a container without fonts as on a desktop. plotters draws text only through fonts
// registered with it: the workspace builds it with `default-features = false` and the
// `ab_glyph` feature alone (no `ttf`, so no font-kit and no lookup of system fonts).

use std::path::Path;
use std::sync::OnceLock;

use helios_nn::History;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// Open Sans Regular 1.10, from Debian's `fonts-open-sans` 1.11-2 (see `assets/README.md`).
static OPEN_SANS: &[u8] = include_bytes!("../assets/OpenSans-Regular.ttf");

/// The family every text of the plot asks for; also the one plotters' defaults ask for.
const FAMILY: FontFamily<'static> = FontFamily::SansSerif;

/// The picture's size in pixels.
pub const SIZE: (u32, u32) = (800, 500);

/// Registers the embedded font as plotters' `FAMILY` (once per process); false only if the
/// font does not parse, which a test rules out.
fn font() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| register_font(FAMILY.as_str(), FontStyle::Normal, OPEN_SANS).is_ok())
}

/// Draws `h` into `path` (an 800x500 PNG).
pub fn loss_curve(path: &Path, h: &History) -> Result<(), Box<dyn std::error::Error>> {
    if h.train.is_empty() {
        return Err("no steps to plot".into());
    }
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    draw(&root, h, font())?;
    root.present()?;
    Ok(())
}

/// Draws `h` on `root`, with captions, axes and a legend when `text` (the font is
/// registered). Without text, plotters 0.3.7 loops forever computing key points for an axis
/// asked for zero labels, so the mesh is left out then.
fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    h: &History,
    text: bool,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    if h.train.is_empty() {
        return Err("no steps to plot".into());
    }
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
    let mut builder = ChartBuilder::on(root);
    builder.margin(15);
    if text {
        builder
            .caption("Helios GPT-2 training loss", (FAMILY, 24))
            .x_label_area_size(45)
            .y_label_area_size(60);
    }
    let mut chart = builder.build_cartesian_2d(0u64..last, (lo - pad)..(hi + pad))?;
    if text {
        chart
            .configure_mesh()
            .label_style((FAMILY, 16))
            .axis_desc_style((FAMILY, 17))
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
            .label_font((FAMILY, 15))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
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
            comm_ms: 0.0,
            step_ms: 3.0,
            record_ms: 1.0,
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

    /// `h` drawn into an in-memory RGB picture of `SIZE`.
    fn render(h: &History, text: bool) -> Vec<u8> {
        let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
            draw(&root, h, text && font()).unwrap();
            root.present().unwrap();
        }
        buf
    }

    /// Pixels in columns `xs` and rows `ys` of `buf` that are dark grey: text (black, its
    /// edges blended with white). The curves are blue and red, the grid lines lighter grey
    /// (204 and 229).
    fn text_pixels(buf: &[u8], xs: std::ops::Range<u32>, ys: std::ops::Range<u32>) -> usize {
        let mut n = 0;
        for y in ys {
            for x in xs.clone() {
                let at = 3 * (y * SIZE.0 + x) as usize;
                let [r, g, b] = [buf[at], buf[at + 1], buf[at + 2]];
                n += usize::from(r == g && g == b && r < 200);
            }
        }
        n
    }

    /// The title, tick numbers and axis descriptions are drawn with the font the binary
    /// carries: nothing is read from the machine's font directories, so a server without
    /// fonts draws them too (it drew the curves alone: issue 49).
    #[test]
    fn title_ticks_and_axis_labels_are_drawn_with_the_embedded_font() {
        assert!(font(), "the embedded font parses and registers");
        let (w, h) = SIZE;
        let pic = render(&history(), true);
        // Title band (above the plotting area), left label area (tick numbers and the
        // y description, left of the axis and its ticks), bottom label area.
        let title = text_pixels(&pic, 0..w, 0..40);
        let left = text_pixels(&pic, 0..60, 60..h - 60);
        let bottom = text_pixels(&pic, 80..w, h - 50..h);
        assert!(title > 100, "title band: {title} text pixels");
        assert!(left > 100, "y labels: {left} text pixels");
        assert!(bottom > 100, "x labels: {bottom} text pixels");
        // Without text the same bands are blank: the counts above are the text's.
        let bare = render(&history(), false);
        assert_eq!(text_pixels(&bare, 0..w, 0..40), 0);
    }

    /// With and without text the curve is drawn, in bounded time (without it, plotters
    /// once looped forever on an axis of zero labels: a machine without fonts hung at the
    /// end of `helios train`), and `loss_curve` writes a PNG.
    #[test]
    fn curves_are_drawn_with_and_without_text() {
        for text in [false, true] {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let pic = render(&history(), text);
                let _ = tx.send(pic.iter().any(|&c| c != 255));
            });
            let drawn = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("the curve is drawn within a minute");
            assert!(drawn);
        }
        let dir = std::env::temp_dir().join(format!("helios-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("loss.png");
        loss_curve(&path, &history()).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > 1000);
        std::fs::remove_dir_all(&dir).ok();
    }
}
