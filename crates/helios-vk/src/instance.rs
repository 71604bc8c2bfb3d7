//! Loading Vulkan and creating the instance, with optional validation.
//!
//! The loader is opened at run time (`ash::Entry::load`, a dlopen), so a machine without
//! Vulkan gets an error naming the packages to install instead of a link failure. With
//! validation on, the Khronos layer runs with synchronization validation, and a debug-utils
//! messenger collects every warning and error into a list that tests assert is empty: a
//! validation message is a bug, never noise to scroll past.

use crate::sync::LockExt;
use ash::vk;
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex};

use crate::adapter::Adapter;
use crate::env;
use crate::error::{vk_err, Error, Result};
use crate::probe;

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";
const DEBUG_UTILS: &CStr = ash::ext::debug_utils::NAME;
const VALIDATION_FEATURES: &CStr = ash::ext::validation_features::NAME;
const PORTABILITY_ENUMERATION: &CStr = ash::khr::portability_enumeration::NAME;

/// Lowest Vulkan version Helios runs on (timeline semaphores, buffer device address).
pub(crate) const MIN_API_VERSION: u32 = vk::API_VERSION_1_2;
/// Highest version Helios asks for; newer loaders still give 1.3 semantics.
const MAX_API_VERSION: u32 = vk::API_VERSION_1_3;

#[derive(Clone, Debug, Default)]
pub struct InstanceOptions {
    /// Khronos validation layer + synchronization validation, messages collected.
    pub validation: bool,
}

impl InstanceOptions {
    /// Reads `HELIOS_VALIDATION` (1/0); unset means off.
    pub fn from_env() -> Result<Self> {
        Ok(InstanceOptions {
            validation: env::flag(env::HELIOS_VALIDATION)?.unwrap_or(false),
        })
    }
}

type Messages = Arc<Mutex<Vec<String>>>;

struct Messenger {
    loader: ash::ext::debug_utils::Instance,
    handle: vk::DebugUtilsMessengerEXT,
}

pub struct Instance {
    entry: ash::Entry,
    raw: ash::Instance,
    api_version: u32,
    options: InstanceOptions,
    /// Spec version of the enabled validation layer (None without validation).
    validation_layer_version: Option<u32>,
    messenger: Option<Messenger>,
    /// Shared with the messenger callback through a raw pointer, so it must outlive `raw`.
    messages: Messages,
}

impl Instance {
    pub fn new(options: &InstanceOptions) -> Result<Instance> {
        // SAFETY: loading libvulkan runs its initialisers; that is the documented way in.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| Error::LoaderMissing {
            detail: e.to_string(),
        })?;

        // SAFETY: plain global queries on a loaded entry.
        let loader_version = unsafe { entry.try_enumerate_instance_version() }
            .map_err(vk_err("vkEnumerateInstanceVersion"))?
            .unwrap_or(vk::API_VERSION_1_0);
        if loader_version < MIN_API_VERSION {
            return Err(Error::VersionTooOld {
                what: "the Vulkan loader",
                found: crate::conv::api_version(loader_version),
                needed: "1.2",
            });
        }
        let api_version = loader_version.min(MAX_API_VERSION);

        let global_exts = extension_names(&entry, None)?;
        let mut layers: Vec<&CStr> = Vec::new();
        let mut exts: Vec<&CStr> = Vec::new();
        let mut flags = vk::InstanceCreateFlags::empty();
        let mut validation_layer_version = None;
        if global_exts
            .iter()
            .any(|e| e.as_c_str() == PORTABILITY_ENUMERATION)
        {
            // Lets non-conformant implementations (MoltenVK) be enumerated at all.
            exts.push(PORTABILITY_ENUMERATION);
            flags |= vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR;
        }
        if options.validation {
            // SAFETY: global query.
            let layer_props = unsafe { entry.enumerate_instance_layer_properties() }
                .map_err(vk_err("vkEnumerateInstanceLayerProperties"))?;
            let layer = layer_props
                .iter()
                .find(|l| l.layer_name_as_c_str().ok() == Some(VALIDATION_LAYER))
                .ok_or(Error::ValidationLayerMissing)?;
            validation_layer_version = Some(layer.spec_version);
            let layer_exts = extension_names(&entry, Some(VALIDATION_LAYER))?;
            let offered = |name: &CStr| {
                global_exts
                    .iter()
                    .chain(&layer_exts)
                    .any(|e| e.as_c_str() == name)
            };
            for name in [DEBUG_UTILS, VALIDATION_FEATURES] {
                if !offered(name) {
                    return Err(Error::ValidationExtensionMissing(
                        name.to_str().unwrap_or("?"),
                    ));
                }
                exts.push(name);
            }
            layers.push(VALIDATION_LAYER);
        }

        let messages: Messages = Arc::default();
        let app_info = vk::ApplicationInfo::default()
            .application_name(c"helios")
            .engine_name(c"helios")
            .engine_version(vk::make_api_version(0, 0, 1, 0))
            .api_version(api_version);
        let layer_ptrs: Vec<_> = layers.iter().map(|l| l.as_ptr()).collect();
        let ext_ptrs: Vec<_> = exts.iter().map(|e| e.as_ptr()).collect();
        let enabled_validation = [vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION];
        let mut validation_features =
            vk::ValidationFeaturesEXT::default().enabled_validation_features(&enabled_validation);
        // Chained into the create info too, so that messages from vkCreateInstance and
        // vkDestroyInstance are caught as well.
        let mut messenger_info = messenger_create_info(&messages);
        let mut create_info = vk::InstanceCreateInfo::default()
            .flags(flags)
            .application_info(&app_info)
            .enabled_layer_names(&layer_ptrs)
            .enabled_extension_names(&ext_ptrs);
        if options.validation {
            create_info = create_info
                .push_next(&mut validation_features)
                .push_next(&mut messenger_info);
        }
        // SAFETY: every pointer in create_info refers to locals that outlive the call.
        let raw = unsafe { entry.create_instance(&create_info, None) }.map_err(|r| match r {
            vk::Result::ERROR_INCOMPATIBLE_DRIVER => Error::NoDevice,
            vk::Result::ERROR_LAYER_NOT_PRESENT => Error::ValidationLayerMissing,
            r => Error::vk("vkCreateInstance", r),
        })?;

        let mut instance = Instance {
            entry,
            raw,
            api_version,
            options: options.clone(),
            validation_layer_version,
            messenger: None,
            messages,
        };
        if options.validation {
            let loader = ash::ext::debug_utils::Instance::new(&instance.entry, &instance.raw);
            let info = messenger_create_info(&instance.messages);
            // SAFETY: the user-data pointer targets `instance.messages`, which is dropped
            // only after the messenger and the instance are destroyed (see Drop).
            let handle = unsafe { loader.create_debug_utils_messenger(&info, None) }
                .map_err(vk_err("vkCreateDebugUtilsMessengerEXT"))?;
            instance.messenger = Some(Messenger { loader, handle });
        }
        Ok(instance)
    }

    /// Every Vulkan device, in enumeration order, with its capabilities probed once.
    pub fn adapters(&self) -> Result<Vec<Adapter>> {
        // SAFETY: valid instance.
        let devices = match unsafe { self.raw.enumerate_physical_devices() } {
            Ok(d) => d,
            // The loader's answer when it found no driver at all.
            Err(vk::Result::ERROR_INITIALIZATION_FAILED) => Vec::new(),
            Err(r) => return Err(Error::vk("vkEnumeratePhysicalDevices", r)),
        };
        devices
            .into_iter()
            .enumerate()
            .map(|(index, pd)| {
                let caps = probe::probe(&self.entry, &self.raw, pd)?;
                Ok(Adapter::new(index, pd, self.raw.handle(), caps))
            })
            .collect()
    }

    /// Validation warnings and errors collected so far (always empty without validation).
    pub fn validation_messages(&self) -> Vec<String> {
        self.messages.locked().clone()
    }

    pub fn options(&self) -> &InstanceOptions {
        &self.options
    }

    /// The instance's Vulkan version (`min(loader, 1.3)`).
    pub fn api_version(&self) -> u32 {
        self.api_version
    }

    /// Vulkan header version of the validation layer in use, if validation is on.
    pub fn validation_layer_version(&self) -> Option<u32> {
        self.validation_layer_version
    }

    pub(crate) fn raw(&self) -> &ash::Instance {
        &self.raw
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: devices created from this instance hold an Arc<Instance>, so they are gone;
        // the messenger goes before the instance, and `messages` outlives both.
        unsafe {
            if let Some(m) = self.messenger.take() {
                m.loader.destroy_debug_utils_messenger(m.handle, None);
            }
            self.raw.destroy_instance(None);
        }
    }
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("api_version", &crate::conv::api_version(self.api_version))
            .field("options", &self.options)
            .finish()
    }
}

fn extension_names(entry: &ash::Entry, layer: Option<&CStr>) -> Result<Vec<std::ffi::CString>> {
    // SAFETY: global query.
    let props = unsafe { entry.enumerate_instance_extension_properties(layer) }
        .map_err(vk_err("vkEnumerateInstanceExtensionProperties"))?;
    Ok(props
        .iter()
        .filter_map(|p| p.extension_name_as_c_str().ok().map(CStr::to_owned))
        .collect())
}

fn messenger_create_info(messages: &Messages) -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(on_message))
        .user_data(Arc::as_ptr(messages) as *mut c_void)
}

/// Called by the validation layer on any thread; must not unwind into C.
unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    kind: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user_data: *mut c_void,
) -> vk::Bool32 {
    let level = if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        "error"
    } else if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::WARNING) {
        "warning"
    } else {
        return vk::FALSE;
    };
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the layer passes valid callback data or null; strings are NUL-terminated.
        let (id, text) = unsafe {
            match data.as_ref() {
                Some(d) => (
                    d.message_id_name_as_c_str()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    d.message_as_c_str()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                ),
                None => (String::new(), String::new()),
            }
        };
        let line = format!("vulkan {level} ({kind:?}) {id}: {text}");
        eprintln!("{line}");
        // SAFETY: user_data is `Arc::as_ptr` of the instance's message list, alive until
        // after the messenger is destroyed.
        if let Some(messages) = unsafe { (user_data as *const Mutex<Vec<String>>).as_ref() } {
            messages.locked().push(line);
        }
    });
    vk::FALSE
}
