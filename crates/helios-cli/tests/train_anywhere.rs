// `helios train` as a new user first runs it (issue 49): from a directory that is not the
// repository's root, where the default corpus must still be found (the binary carries it),
// and on a machine without fonts, where the loss plot must still have its text (the binary
// carries its font). Each run trains a one-layer model for two steps on the default device.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh, empty directory under the system's temp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("helios-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `helios train` of a tiny model on the default corpus, for two steps, in `cwd`.
const TRAIN: [&str; 21] = [
    "train",
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-embd",
    "32",
    "--block-size",
    "32",
    "--seq",
    "32",
    "--batch",
    "2",
    "--steps",
    "2",
    "--eval-every",
    "1",
    "--eval-batches",
    "1",
    "--sample-tokens",
    "0",
];

fn check(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helios train failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Dark grey pixels (text: black, its edges blended with white) in rows `ys` of the RGB
/// PNG at `path`; the curves are blue and red, the grid lines lighter grey.
fn text_pixels(path: &Path, ys: std::ops::Range<u32>) -> usize {
    let file = std::fs::File::open(path).unwrap();
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(
        (info.color_type, info.bit_depth),
        (png::ColorType::Rgb, png::BitDepth::Eight)
    );
    let row = info.line_size;
    ys.flat_map(|y| buf[y as usize * row..(y as usize + 1) * row].chunks_exact(3))
        .filter(|p| p[0] == p[1] && p[1] == p[2] && p[0] < 200)
        .count()
}

/// The default corpus is found from a directory without `data/` (it was
/// `data/shakespeare/shakespeare.txt`, relative to the current directory).
#[test]
fn the_default_corpus_is_found_from_any_directory() {
    let cwd = scratch("anywhere");
    assert!(!cwd.join("data").exists());
    let out = Command::new(env!("CARGO_BIN_EXE_helios"))
        .args(TRAIN)
        .arg("--out")
        .arg(cwd.join("out"))
        .current_dir(&cwd)
        .env_remove("HELIOS_DEVICE")
        .output()
        .expect("run helios");
    let stdout = check(&out);
    assert!(stdout.contains("data: the bundled corpus"), "{stdout}");
    assert!(cwd.join("out/loss.png").is_file());
    let _ = std::fs::remove_dir_all(&cwd);
}

/// With the machine's font directories hidden (an empty directory mounted over them in a
/// private mount namespace), the loss plot still has its title: it was blank there. Needs
/// `unshare -m` (root, or user namespaces); skipped where that is refused.
#[test]
fn the_loss_plot_has_text_on_a_machine_without_fonts() {
    let can = Command::new("unshare")
        .args(["-m", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !can {
        eprintln!("skipped: `unshare -m` is not available here");
        return;
    }
    let cwd = scratch("no-fonts");
    let empty = cwd.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    // Hide every font directory that exists, check that none is left, then run helios.
    let script = r#"empty="$1"; shift
        for d in /usr/share/fonts /usr/local/share/fonts "$HOME/.fonts" "$HOME/.local/share/fonts"; do
            if [ -d "$d" ]; then mount --bind "$empty" "$d" || exit 97; fi
        done
        for d in /usr/share/fonts /usr/local/share/fonts; do
            if [ -d "$d" ] && [ -n "$(ls -A "$d")" ]; then exit 98; fi
        done
        exec "$@""#;
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", script, "sh"])
        .arg(&empty)
        .arg(env!("CARGO_BIN_EXE_helios"))
        .args(TRAIN)
        .arg("--out")
        .arg(cwd.join("out"))
        .current_dir(&cwd)
        .env_remove("HELIOS_DEVICE")
        .output()
        .expect("run helios");
    if out.status.code().is_some_and(|c| c == 97 || c == 98) {
        eprintln!("skipped: the font directories cannot be hidden here");
        let _ = std::fs::remove_dir_all(&cwd);
        return;
    }
    check(&out);
    let png = cwd.join("out/loss.png");
    // The title band, above the plotting area, and the x axis' labels at the bottom.
    let title = text_pixels(&png, 0..40);
    let bottom = text_pixels(&png, 450..500);
    assert!(title > 100, "title band: {title} text pixels");
    assert!(bottom > 100, "x labels: {bottom} text pixels");
    let _ = std::fs::remove_dir_all(&cwd);
}

/// Settings that cannot work fail before any training, saying what to change: an empty
/// prompt for the sample (it failed after the whole run) and `--nproc 0`.
#[test]
fn a_bad_sample_prompt_or_rank_count_fails_before_training() {
    let cwd = scratch("early-errors");
    for (extra, says) in [
        (
            &["--sample-tokens", "5", "--prompt", ""][..],
            "--prompt is empty",
        ),
        (
            &["--nproc", "0", "--sample-tokens", "0"][..],
            "--nproc must be at least 1",
        ),
    ] {
        // TRAIN without its --sample-tokens 0, which the first case sets otherwise.
        let out = Command::new(env!("CARGO_BIN_EXE_helios"))
            .args(&TRAIN[..TRAIN.len() - 2])
            .args(extra)
            .arg("--out")
            .arg(cwd.join("out"))
            .output()
            .expect("run helios");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} succeeded");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
        assert!(!cwd.join("out/checkpoint").exists(), "{extra:?} trained");
    }
    let _ = std::fs::remove_dir_all(&cwd);
}
