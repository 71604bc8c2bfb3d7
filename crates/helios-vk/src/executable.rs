//! The driver's own view of a compiled pipeline (VK_KHR_pipeline_executable_properties).
//!
//! With `HELIOS_PIPELINE_STATS=1` (or `ContextOptions::pipeline_statistics`) on a device that
//! offers the extension, the Context enables pipelineExecutableInfo and creates every compute
//! pipeline with CAPTURE_STATISTICS (plus CAPTURE_INTERNAL_REPRESENTATIONS with `=2`);
//! `Context::pipeline_statistics` then returns what the compiler reports for each executable:
//! with `=2` also internal representations (IR or machine code as text) where the driver
//! offers them. Off (the default), or on a device without the extension, nothing changes and
//! the query returns nothing.
//!
//! Seen on an H200 with NVIDIA 580.159.04: one executable "CS" per pipeline with Register
//! Count, Binary Size, Stack Size, Local Memory Size and Shared Memory Size (bytes), also for
//! pipelines created through a loaded pipeline cache, and no internal representations at all.
//! Its Local Memory Size carries bit 36 (68719476736 = 2^36 where a kernel uses none, 2^36 + 240
//! for a 255-register matmul tile): the low bits are the bytes. Values are passed on as given.

use ash::vk;
use serde::Serialize;

use crate::conv;
use crate::env;
use crate::error::{vk_err, Error, Result};

/// `HELIOS_PIPELINE_STATS=1` captures the compiler statistics of every compute pipeline
/// (`Context::pipeline_statistics`); `=2` also captures its internal representations (such as
/// SASS text); `0` or unset captures nothing. Needs VK_KHR_pipeline_executable_properties.
pub const HELIOS_PIPELINE_STATS: &str = "HELIOS_PIPELINE_STATS";

/// What pipelines capture for `Context::pipeline_statistics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutableCapture {
    /// Nothing (the default): pipelines are created exactly as without the extension.
    #[default]
    Off,
    /// Compiler statistics (`HELIOS_PIPELINE_STATS=1`).
    Statistics,
    /// Statistics and internal representations (`HELIOS_PIPELINE_STATS=2`).
    Representations,
}

impl ExecutableCapture {
    /// Reads `HELIOS_PIPELINE_STATS`: unset, blank or `0` is `Off`, `1` statistics, `2`
    /// statistics and representations; anything else is an error.
    pub fn from_env() -> Result<Self> {
        Self::parse(env::string(HELIOS_PIPELINE_STATS).as_deref())
    }

    fn parse(value: Option<&str>) -> Result<Self> {
        match value {
            None | Some("0") => Ok(ExecutableCapture::Off),
            Some("1") => Ok(ExecutableCapture::Statistics),
            Some("2") => Ok(ExecutableCapture::Representations),
            Some(v) => Err(Error::BadEnvVar {
                name: HELIOS_PIPELINE_STATS,
                value: v.to_owned(),
                expected: "use 0 (off), 1 (compiler statistics) or 2 (statistics and \
                           internal representations)",
            }),
        }
    }

    /// The VkPipelineCreateFlags that capture this much.
    pub(crate) fn create_flags(self) -> vk::PipelineCreateFlags {
        match self {
            ExecutableCapture::Off => vk::PipelineCreateFlags::empty(),
            ExecutableCapture::Statistics => vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR,
            ExecutableCapture::Representations => {
                vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                    | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR
            }
        }
    }
}

/// One compiler statistic's value, as the driver typed it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StatValue {
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
}

impl std::fmt::Display for StatValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatValue::Bool(v) => write!(f, "{v}"),
            StatValue::I64(v) => write!(f, "{v}"),
            StatValue::U64(v) => write!(f, "{v}"),
            StatValue::F64(v) => write!(f, "{v}"),
        }
    }
}

/// What the driver reports about one executable (for a compute pipeline, usually its one
/// compute shader).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExecutableStats {
    /// The driver's short name for the executable.
    pub name: String,
    pub description: String,
    /// Subgroup size the executable runs with (0 where the driver does not say).
    pub subgroup_size: u32,
    /// (statistic name, value), in the driver's order: on NVIDIA register count, binary
    /// size, stack, local (spill) and shared memory.
    pub stats: Vec<(String, StatValue)>,
    /// (representation name, text) of the text representations, when they were captured
    /// (`ExecutableCapture::Representations`).
    pub representations: Vec<(String, String)>,
    /// (representation name, bytes) of the binary representations, which are not kept.
    pub binary_representations: Vec<(String, usize)>,
}

impl ExecutableStats {
    /// The statistic called `name`, if the driver reports one.
    pub fn stat(&self, name: &str) -> Option<StatValue> {
        self.stats.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// The `HELIOS_PIPELINE_STATS` report of `executables` (the statistics of pipeline `name`,
/// or why there are none): one stderr line of statistics per executable (`helios: stats
/// <name>: <stat>=<value>, ...`). Returns the executables it printed.
pub(crate) fn report(
    name: &str,
    executables: Result<Vec<ExecutableStats>>,
) -> Vec<ExecutableStats> {
    let executables = match executables {
        Ok(e) => e,
        Err(e) => {
            eprintln!("helios: no statistics for {name}: {e}");
            return Vec::new();
        }
    };
    for (i, exec) in executables.iter().enumerate() {
        let label = match executables.len() {
            1 => name.to_string(),
            _ => format!("{name}#{i}"),
        };
        let stats: Vec<String> = exec
            .stats
            .iter()
            .map(|(stat, value)| format!("{stat}={value}"))
            .collect();
        eprintln!("helios: stats {label}: {}", stats.join(", "));
    }
    executables
}

/// The driver's statistics (and, when captured, text representations) of every executable
/// of `pipeline`, created with `captured` on the device of `ext`; empty when `ext` is `None`
/// or the pipeline captured no statistics.
pub(crate) fn statistics(
    ext: Option<&ash::khr::pipeline_executable_properties::Device>,
    pipeline: vk::Pipeline,
    captured: vk::PipelineCreateFlags,
) -> Result<Vec<ExecutableStats>> {
    let Some(ext) = ext else {
        return Ok(Vec::new());
    };
    if !captured.contains(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR) {
        return Ok(Vec::new());
    }
    let with_reprs =
        captured.contains(vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR);
    let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
    // SAFETY: the pipeline belongs to this device, which enabled pipelineExecutableInfo.
    let props = unsafe { ext.get_pipeline_executable_properties(&info) }
        .map_err(vk_err("vkGetPipelineExecutablePropertiesKHR"))?;
    let mut out = Vec::with_capacity(props.len());
    for (index, p) in (0u32..).zip(&props) {
        let exec = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(index);
        // SAFETY: as above; the pipeline was created with CAPTURE_STATISTICS_KHR.
        let stats = unsafe { ext.get_pipeline_executable_statistics(&exec) }
            .map_err(vk_err("vkGetPipelineExecutableStatisticsKHR"))?
            .iter()
            .map(|s| (conv::c_chars(&s.name), stat_value(s)))
            .collect();
        let (representations, binary_representations) = if with_reprs {
            internal_representations(ext, &exec)?
        } else {
            Default::default()
        };
        out.push(ExecutableStats {
            name: conv::c_chars(&p.name),
            description: conv::c_chars(&p.description),
            subgroup_size: p.subgroup_size,
            stats,
            representations,
            binary_representations,
        });
    }
    Ok(out)
}

fn stat_value(s: &vk::PipelineExecutableStatisticKHR<'_>) -> StatValue {
    // SAFETY: `format` says which member of the union the driver wrote.
    unsafe {
        match s.format {
            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                StatValue::Bool(s.value.b32 == vk::TRUE)
            }
            vk::PipelineExecutableStatisticFormatKHR::INT64 => StatValue::I64(s.value.i64),
            vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => StatValue::F64(s.value.f64),
            _ => StatValue::U64(s.value.u64),
        }
    }
}

/// (name, text) of the text representations and (name, bytes) of the binary ones.
type Representations = (Vec<(String, String)>, Vec<(String, usize)>);

/// Text and binary representations of one executable: the entries (with their sizes) first,
/// then a call with a buffer of that size for each.
fn internal_representations(
    ext: &ash::khr::pipeline_executable_properties::Device,
    exec: &vk::PipelineExecutableInfoKHR<'_>,
) -> Result<Representations> {
    const CALL: &str = "vkGetPipelineExecutableInternalRepresentationsKHR";
    // SAFETY: the pipeline was created with CAPTURE_INTERNAL_REPRESENTATIONS_KHR. With pData
    // null the driver fills in names and dataSize only.
    let mut reprs = unsafe { ext.get_pipeline_executable_internal_representations(exec) }
        .map_err(vk_err(CALL))?;
    let mut buffers: Vec<Vec<u8>> = reprs.iter().map(|r| vec![0u8; r.data_size]).collect();
    for (r, buf) in reprs.iter_mut().zip(&mut buffers) {
        r.p_data = buf.as_mut_ptr().cast();
    }
    let mut count = reprs.len() as u32;
    // SAFETY: `reprs` holds `count` entries, each pointing at a buffer of its dataSize
    // bytes that outlives the call. VK_INCOMPLETE only means a representation was cut short.
    let fill = ext
        .fp()
        .get_pipeline_executable_internal_representations_khr;
    let result = unsafe { fill(ext.device(), exec, &mut count, reprs.as_mut_ptr()) };
    if result != vk::Result::SUCCESS && result != vk::Result::INCOMPLETE {
        return Err(Error::vk(CALL, result));
    }
    let (mut text, mut binary) = (Vec::new(), Vec::new());
    for (r, buf) in reprs.iter().zip(buffers).take(count as usize) {
        let name = conv::c_chars(&r.name);
        let len = r.data_size.min(buf.len());
        if r.is_text == vk::TRUE {
            let bytes = &buf[..len];
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(len);
            text.push((name, String::from_utf8_lossy(&bytes[..end]).into_owned()));
        } else {
            binary.push((name, len));
        }
    }
    Ok((text, binary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_capture_what_they_say() {
        use vk::PipelineCreateFlags as F;
        assert_eq!(ExecutableCapture::Off.create_flags(), F::empty());
        assert_eq!(
            ExecutableCapture::Statistics.create_flags(),
            F::CAPTURE_STATISTICS_KHR
        );
        assert_eq!(
            ExecutableCapture::Representations.create_flags(),
            F::CAPTURE_STATISTICS_KHR | F::CAPTURE_INTERNAL_REPRESENTATIONS_KHR
        );
    }

    #[test]
    fn env_values() {
        use ExecutableCapture as C;
        assert_eq!(C::parse(None).unwrap(), C::Off);
        assert_eq!(C::parse(Some("0")).unwrap(), C::Off);
        assert_eq!(C::parse(Some("1")).unwrap(), C::Statistics);
        assert_eq!(C::parse(Some("2")).unwrap(), C::Representations);
        let err = C::parse(Some("yes")).unwrap_err().to_string();
        assert!(err.contains(HELIOS_PIPELINE_STATS), "{err}");
    }

    #[test]
    fn values_print_plainly() {
        assert_eq!(StatValue::U64(96).to_string(), "96");
        assert_eq!(StatValue::I64(-1).to_string(), "-1");
        assert_eq!(StatValue::Bool(true).to_string(), "true");
        assert_eq!(StatValue::F64(0.5).to_string(), "0.5");
    }
}
