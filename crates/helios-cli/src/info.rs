// `helios info`: every Vulkan device with its probed capabilities, and which one Helios
// picks (HELIOS_DEVICE or the default order).
//
// The text layout groups `Caps` for reading; `--json` prints the same `Caps` values
// unchanged, so scripts and bug reports get everything, including the extension list.
// Output is built as one string and written once, so a closed pipe (`| head`) is not a
// panic.

use clap::Args;
use helios_vk::{select_adapter_from_env, Caps, Instance, InstanceOptions};
use serde::Serialize;
use std::io::Write as _;

use crate::CliResult;

#[derive(Args)]
pub struct InfoArgs {
    /// Print JSON: {"selected": index, "devices": [caps, ...]}.
    #[arg(long)]
    json: bool,
    /// Also list every device extension (text output).
    #[arg(long)]
    extensions: bool,
}

/// The `--json` document; a struct (not `json!`) so fields keep their declared order.
#[derive(Serialize)]
struct JsonReport<'a> {
    /// Index of the device Helios would use.
    selected: usize,
    devices: &'a [&'a Caps],
}

pub fn run(args: &InfoArgs) -> CliResult {
    let instance = Instance::new(&InstanceOptions::from_env()?)?;
    let adapters = instance.adapters()?;
    if adapters.is_empty() {
        return Err(helios_vk::Error::NoDevice.into());
    }
    let selected = select_adapter_from_env(&adapters)?.index();
    let caps: Vec<&Caps> = adapters.iter().map(|a| a.caps()).collect();

    let out = if args.json {
        let report = JsonReport {
            selected,
            devices: &caps,
        };
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        let mut s = format!(
            "{} Vulkan device(s); Helios uses [{selected}] (set HELIOS_DEVICE to an index or a \
             part of a name to change)\n",
            caps.len()
        );
        for (index, c) in caps.iter().enumerate() {
            s.push('\n');
            describe(&mut s, index, c, index == selected, args.extensions);
        }
        s.push('\n');
        s.push_str(&tuning_line()?);
        s
    };
    write_stdout(&out)?;

    let messages = instance.validation_messages();
    if !messages.is_empty() {
        return Err(format!(
            "{} Vulkan validation message(s), printed above",
            messages.len()
        )
        .into());
    }
    Ok(())
}

/// How the selected device chooses kernels, and what is stored for it: tuning on real work
/// has nothing to show before a program runs, so the stored winners are the state.
fn tuning_line() -> Result<String, Box<dyn std::error::Error>> {
    let device = helios::Device::from_env()?;
    let how = match helios::tuning(&device) {
        helios::Tuning::Off => {
            "off, each shape's first choice runs (HELIOS_MATMUL_TUNE=1: on real work)"
        }
        helios::Tuning::Online => "on real work (HELIOS_MATMUL_TUNE=full: before first use)",
        helios::Tuning::Exhaustive => "exhaustive, before each shape's first use",
    };
    Ok(format!(
        "kernel tuning: {how}; stored winners for this device and driver: {} matmul, {} \
         attention\n",
        helios::stored_winners(&device, "matmul"),
        helios::stored_winners(&device, "attention")
    ))
}

fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

fn describe(s: &mut String, index: usize, c: &Caps, selected: bool, extensions: bool) {
    let mark = if selected { "   <- selected" } else { "" };
    line(s, &format!("[{index}] {}{mark}", c.name));
    top(s, "vendor", format!("{} ({:#x})", c.vendor, c.vendor_id));
    top(s, "device id", format!("{:#06x}", c.device_id));
    top(s, "type", c.device_type.to_string());
    top(s, "vulkan", c.api_version.clone());
    let driver = format!("{} {} ({})", c.driver_name, c.driver_version, c.driver_info);
    top(s, "driver", driver);
    top(s, "device uuid", c.device_uuid.clone());
    if let Some(n) = c.sm_count {
        top(s, "multiprocessors", n.to_string());
    }
    top(s, "pipeline cache uuid", c.pipeline_cache_uuid.clone());

    let memory = format!(
        "unified {}, host-visible device-local {}",
        yes_no(c.unified_memory),
        yes_no(c.host_visible_device_local)
    );
    top(s, "memory", memory);
    for h in &c.memory_heaps {
        let kind = if h.device_local {
            "device_local"
        } else {
            "host"
        };
        sub(
            s,
            &format!("heap {}", h.index),
            format!("{:.2} GiB  {kind}", gib(h.size)),
        );
    }
    for t in &c.memory_types {
        let value = format!("heap {}  {}", t.heap_index, t.flags.join(" "));
        sub(s, &format!("type {}", t.index), value);
    }
    // What CUDA interop (helios::interop) can use on this device.
    let x = &c.external;
    let fd = |listed: bool, e: helios_vk::ExternalSupport| match (listed, e.exportable) {
        (false, _) => "no".to_string(),
        (true, false) => "extension listed, not exportable".to_string(),
        (true, true) => format!(
            "export yes, import {}{}",
            yes_no(e.importable),
            if e.dedicated_only {
                ", dedicated only"
            } else {
                ""
            }
        ),
    };
    top(s, "opaque fd sharing", String::new());
    sub(s, "memory", fd(x.memory_fd, x.memory));
    sub(s, "timeline semaphore", fd(x.semaphore_fd, x.timeline));

    top(s, "queue families", String::new());
    for q in &c.queue_families {
        let value = format!(
            "{} x{}, timestamps {} bits",
            q.flags.join(" "),
            q.queue_count,
            q.timestamp_valid_bits
        );
        sub(s, &format!("family {}", q.index), value);
    }

    let sg = &c.subgroup;
    let range = match (sg.min_size, sg.max_size) {
        (Some(lo), Some(hi)) => format!(" (size control {lo}..{hi})"),
        _ => String::new(),
    };
    let in_compute = yes_no(sg.compute_stage);
    top(
        s,
        "subgroup",
        format!("size {}{range}, in compute {in_compute}", sg.size),
    );
    sub(s, "operations", sg.operations.join(" "));

    let l = &c.limits;
    top(s, "limits", String::new());
    sub(
        s,
        "shared memory",
        bytes(u64::from(l.max_compute_shared_memory)),
    );
    sub(
        s,
        "push constants",
        bytes(u64::from(l.max_push_constants_size)),
    );
    let [x, y, z] = l.max_workgroup_size;
    let invocations = l.max_workgroup_invocations;
    sub(
        s,
        "workgroup size",
        format!("{x} x {y} x {z}, {invocations} invocations"),
    );
    let [x, y, z] = l.max_workgroup_count;
    sub(s, "workgroup count", format!("{x} x {y} x {z}"));
    sub(
        s,
        "storage buffer range",
        bytes(u64::from(l.max_storage_buffer_range)),
    );
    let align = l.min_storage_buffer_offset_alignment.to_string();
    sub(s, "storage offset align", align);
    sub(s, "max allocation", bytes(l.max_memory_allocation_size));
    sub(
        s,
        "max buffer",
        l.max_buffer_size.map_or("unknown".into(), bytes),
    );
    sub(s, "timestamp period", format!("{} ns", l.timestamp_period));

    let f = &c.features;
    top(s, "features", String::new());
    for (name, on) in [
        ("shader_float16", f.shader_float16),
        ("shader_int8", f.shader_int8),
        ("shader_int16", f.shader_int16),
        ("shader_int64", f.shader_int64),
        ("storage_buffer_16bit", f.storage_buffer_16bit),
        ("storage_buffer_8bit", f.storage_buffer_8bit),
        ("bfloat16", f.bfloat16),
        ("bfloat16_dot_product", f.bfloat16_dot_product),
        ("bfloat16_coopmat", f.bfloat16_cooperative_matrix),
        ("timeline_semaphore", f.timeline_semaphore),
        ("buffer_device_address", f.buffer_device_address),
        ("vulkan_memory_model", f.vulkan_memory_model),
        ("vmm_device_scope", f.vulkan_memory_model_device_scope),
        ("push_descriptor", f.push_descriptor),
        ("subgroup_size_control", f.subgroup_size_control),
        ("compute_full_subgroups", f.compute_full_subgroups),
        ("maintenance4", f.maintenance4),
        ("synchronization2", f.synchronization2),
        ("cooperative_matrix", f.cooperative_matrix),
        ("buffer_f32_atomic_add", f.shader_buffer_float32_atomic_add),
        ("nv_cooperative_matrix2", c.nv_cooperative_matrix2),
        ("nvx_binary_import", f.native_kernels),
    ] {
        sub(s, name, yes_no(on).into());
    }

    if c.cooperative_matrix.is_empty() {
        top(s, "cooperative matrix", "none".into());
    } else {
        top(s, "cooperative matrix", String::new());
        let header = format!(
            "{:<12}{:<6}{:<6}{:<6}{:<8}scope",
            "MxNxK", "A", "B", "C", "Result"
        );
        line(s, &format!("    {header}"));
        for m in &c.cooperative_matrix {
            let shape = format!("{}x{}x{}", m.m, m.n, m.k);
            let sat = if m.saturating_accumulation {
                " (saturating)"
            } else {
                ""
            };
            let row = format!(
                "{shape:<12}{:<6}{:<6}{:<6}{:<8}{}{sat}",
                m.a, m.b, m.c, m.result, m.scope
            );
            line(s, &format!("    {row}"));
        }
    }

    if let Some(c2) = &c.cooperative_matrix2 {
        top(s, "cooperative matrix 2", String::new());
        sub(s, "workgroup_scope", yes_no(c2.workgroup_scope).into());
        sub(
            s,
            "flexible_dimensions",
            yes_no(c2.flexible_dimensions).into(),
        );
        sub(s, "tensor_addressing", yes_no(c2.tensor_addressing).into());
        sub(s, "max_workgroup_size", c2.max_workgroup_size.to_string());
        sub(s, "max_dimension", c2.max_dimension.to_string());
        sub(
            s,
            "reserved_shared",
            format!("{} B", c2.reserved_shared_memory),
        );
        let header = format!(
            "{:<12}{:<6}{:<6}{:<6}{:<8}{:<11}invocations",
            "granules", "A", "B", "C", "Result", "scope"
        );
        line(s, &format!("    {header}"));
        for m in &c2.flexible {
            let g = format!(
                "{}x{}x{}",
                m.m_granularity, m.n_granularity, m.k_granularity
            );
            let row = format!(
                "{g:<12}{:<6}{:<6}{:<6}{:<8}{:<11}{}",
                m.a, m.b, m.c, m.result, m.scope, m.workgroup_invocations
            );
            line(s, &format!("    {row}"));
        }
    }

    if extensions {
        top(s, "extensions", c.extensions.len().to_string());
        for e in &c.extensions {
            line(s, &format!("    {e}"));
        }
    } else {
        let count = c.extensions.len();
        top(
            s,
            "extensions",
            format!("{count} (list them with --extensions)"),
        );
    }
}

/// Values line up in one column: top-level keys at indent 2, nested keys at indent 4.
const VALUE_COLUMN: usize = 28;

fn line(s: &mut String, text: &str) {
    s.push_str(text.trim_end());
    s.push('\n');
}

fn top(s: &mut String, key: &str, value: String) {
    line(s, &format!("  {key:<w$}{value}", w = VALUE_COLUMN - 2));
}

fn sub(s: &mut String, key: &str, value: String) {
    line(s, &format!("    {key:<w$}{value}", w = VALUE_COLUMN - 4));
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Exact bytes plus a rounded unit for sizes of a KiB or more.
fn bytes(b: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match UNITS.iter().find(|(size, _)| b >= *size) {
        Some(&(size, unit)) => {
            let v = b as f64 / size as f64;
            if v.fract() == 0.0 {
                format!("{b} bytes ({v} {unit})")
            } else {
                format!("{b} bytes ({v:.2} {unit})")
            }
        }
        None => format!("{b} bytes"),
    }
}
