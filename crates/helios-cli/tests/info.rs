// `helios info` end to end: text, JSON, validation on, and the two driver failures
// (no device, no loader) that must be a clear message and exit code 1.

use std::process::{Command, Output};

fn helios(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_helios"));
    cmd.args(args).env_remove("HELIOS_DEVICE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run helios")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn info_lists_devices() {
    let out = helios(&["info"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("<- selected"), "{stdout}");
    for key in [
        "subgroup",
        "queue families",
        "cooperative matrix",
        "shader_int64",
        "heap 0",
        "opaque fd sharing",
    ] {
        assert!(stdout.contains(key), "missing {key}: {stdout}");
    }
}

#[test]
fn info_json_has_caps_and_selection() {
    let out = helios(&["info", "--json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let devices = v["devices"].as_array().expect("devices array");
    assert!(!devices.is_empty());
    let selected = v["selected"].as_u64().expect("selected index") as usize;
    assert!(selected < devices.len());
    let d = &devices[selected];
    assert!(d["name"].is_string() && d["subgroup"]["size"].is_u64());
    assert!(d["extensions"].as_array().is_some_and(|e| !e.is_empty()));
}

#[test]
fn info_with_validation_is_clean() {
    let out = helios(&["info", "--json"], &[("HELIOS_VALIDATION", "1")]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("vulkan"), "validation messages: {stderr}");
}

#[test]
fn no_device_is_a_clear_error() {
    for args in [&["info"][..], &["info", "--json"]] {
        let out = helios(
            args,
            &[
                ("VK_DRIVER_FILES", "/nonexistent.json"),
                ("VK_ICD_FILENAMES", "/nonexistent.json"),
            ],
        );
        assert_eq!(out.status.code(), Some(1));
        let stderr = text(&out.stderr);
        // With HELIOS_VALIDATION=1 the loader's own complaints come first; ours is last.
        let last = stderr.lines().last().unwrap_or_default();
        assert!(last.starts_with("error: no Vulkan device"), "{stderr}");
        assert!(
            stderr.contains("mesa-vulkan-drivers") && stderr.contains("libvulkan1"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn unknown_device_selector_lists_devices() {
    let out = helios(&["info"], &[("HELIOS_DEVICE", "no-such-gpu-xyz")]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("available devices") && stderr.contains("0: "),
        "{stderr}"
    );
}

/// Hides libvulkan.so.1 by bind-mounting /dev/null over it in a private mount namespace.
/// Needs `unshare` and the right to mount (root or user namespaces); skipped otherwise.
#[test]
fn missing_loader_is_a_clear_error() {
    let lib = [
        "/lib/x86_64-linux-gnu/libvulkan.so.1",
        "/usr/lib/x86_64-linux-gnu/libvulkan.so.1",
        "/usr/lib64/libvulkan.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    let Some(lib) = lib else {
        eprintln!("SKIPPED missing_loader_is_a_clear_error: no libvulkan.so.1 at a known path");
        return;
    };
    let script = format!("mount --bind /dev/null {lib} || exit 99; exec \"$0\" info");
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script, env!("CARGO_BIN_EXE_helios")])
        .output();
    let out = match out {
        Ok(o) if o.status.code() != Some(99) && !text(&o.stderr).contains("unshare:") => o,
        _ => {
            eprintln!("SKIPPED missing_loader_is_a_clear_error: cannot hide libvulkan here (needs unshare + mount)");
            return;
        }
    };
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: the Vulkan loader"), "{stderr}");
    assert!(
        stderr.contains("libvulkan1") && stderr.contains("mesa-vulkan-drivers"),
        "{stderr}"
    );
}
