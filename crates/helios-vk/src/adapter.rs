//! A physical device with its probed capabilities, and the rule that picks one.
//!
//! Selection is one pure function over a slice of adapters so that it is tested without a
//! GPU and behaves identically in the CLI and the library: an explicit `HELIOS_DEVICE`
//! (index or name substring) wins; otherwise discrete > integrated > virtual > CPU > other,
//! ties keeping enumeration order.

use ash::vk;

use crate::caps::Caps;
use crate::env;
use crate::error::{Error, Result};

#[derive(Clone, Debug)]
pub struct Adapter {
    index: usize,
    raw: vk::PhysicalDevice,
    /// Handle of the instance it came from; Context::new refuses adapters of another one.
    instance: vk::Instance,
    caps: Caps,
}

impl Adapter {
    pub(crate) fn new(
        index: usize,
        raw: vk::PhysicalDevice,
        instance: vk::Instance,
        caps: Caps,
    ) -> Self {
        Adapter {
            index,
            raw,
            instance,
            caps,
        }
    }

    /// Position in the instance's enumeration order (what `HELIOS_DEVICE=<index>` means).
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn name(&self) -> &str {
        &self.caps.name
    }

    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    pub(crate) fn raw(&self) -> vk::PhysicalDevice {
        self.raw
    }

    pub(crate) fn instance_handle(&self) -> vk::Instance {
        self.instance
    }
}

/// Picks the adapter Helios runs on.
///
/// `selector` is an index (`"1"`) or a case-insensitive part of the device name
/// (`"nvidia"`, `"llvmpipe"`); several name matches resolve by the default preference.
pub fn select_adapter<'a>(adapters: &'a [Adapter], selector: Option<&str>) -> Result<&'a Adapter> {
    if adapters.is_empty() {
        return Err(Error::NoDevice);
    }
    let preferred = |candidates: &mut dyn Iterator<Item = &'a Adapter>| {
        // min_by_key keeps the first of equal keys: enumeration order breaks ties.
        candidates.min_by_key(|a| a.caps.device_type.preference())
    };
    let chosen = match selector.map(str::trim).filter(|s| !s.is_empty()) {
        None => preferred(&mut adapters.iter()),
        Some(sel) => match sel.parse::<usize>() {
            Ok(index) => adapters.iter().find(|a| a.index == index),
            Err(_) => {
                let needle = sel.to_lowercase();
                preferred(
                    &mut adapters
                        .iter()
                        .filter(|a| a.caps.name.to_lowercase().contains(&needle)),
                )
            }
        },
    };
    chosen.ok_or_else(|| Error::NoMatchingDevice {
        selector: selector.unwrap_or_default().to_owned(),
        available: describe(adapters),
    })
}

/// `select_adapter` with the selector from `HELIOS_DEVICE`.
pub fn select_adapter_from_env(adapters: &[Adapter]) -> Result<&Adapter> {
    select_adapter(adapters, env::string(env::HELIOS_DEVICE).as_deref())
}

/// One line per adapter, for error messages.
fn describe(adapters: &[Adapter]) -> String {
    adapters
        .iter()
        .map(|a| format!("  {}: {} ({})", a.index, a.caps.name, a.caps.device_type))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::DeviceType;

    fn adapters(devices: &[(&str, DeviceType)]) -> Vec<Adapter> {
        devices
            .iter()
            .enumerate()
            .map(|(i, &(name, device_type))| {
                let caps = Caps {
                    name: name.into(),
                    device_type,
                    ..Default::default()
                };
                Adapter::new(i, vk::PhysicalDevice::null(), vk::Instance::null(), caps)
            })
            .collect()
    }

    #[test]
    fn default_order_prefers_discrete_then_enumeration_order() {
        use DeviceType::*;
        let list = adapters(&[
            ("llvmpipe", Cpu),
            ("Intel UHD", IntegratedGpu),
            ("NVIDIA H200", DiscreteGpu),
            ("NVIDIA H100", DiscreteGpu),
        ]);
        assert_eq!(select_adapter(&list, None).unwrap().index(), 2);
        assert_eq!(select_adapter(&list, Some("  ")).unwrap().index(), 2);
        let list = adapters(&[("llvmpipe", Cpu), ("virgl", VirtualGpu), ("x", Other)]);
        assert_eq!(select_adapter(&list, None).unwrap().index(), 1);
    }

    #[test]
    fn selector_index_and_name() {
        use DeviceType::*;
        let list = adapters(&[("llvmpipe (LLVM 15)", Cpu), ("NVIDIA H200", DiscreteGpu)]);
        assert_eq!(select_adapter(&list, Some("0")).unwrap().index(), 0);
        assert_eq!(select_adapter(&list, Some(" 1 ")).unwrap().index(), 1);
        assert_eq!(select_adapter(&list, Some("LLVMpipe")).unwrap().index(), 0);
        assert_eq!(select_adapter(&list, Some("h200")).unwrap().index(), 1);
        // Several matches: default preference among them.
        assert_eq!(select_adapter(&list, Some("l")).unwrap().index(), 0);
        assert_eq!(select_adapter(&list, Some("i")).unwrap().index(), 1);
        let err = select_adapter(&list, Some("amd")).unwrap_err().to_string();
        assert!(err.contains("0: llvmpipe (LLVM 15) (cpu)"), "{err}");
        assert!(err.contains("1: NVIDIA H200 (discrete_gpu)"), "{err}");
        assert!(select_adapter(&list, Some("2")).is_err());
    }
}
