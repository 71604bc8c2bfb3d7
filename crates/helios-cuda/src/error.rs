//! The one error type of helios-cuda.
//!
//! Every failure is a value whose message says what to do next: a library that will not load
//! names the files tried and how to install it; a failed driver or NCCL call carries the call's
//! name and the library's own name and description of the code.

/// `Result` with helios-cuda's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// [`Error::Library`]'s `name` for the CUDA driver library.
pub const LIBCUDA: &str = "libcuda";
/// [`Error::Library`]'s `name` for NCCL.
pub const LIBNCCL: &str = "libnccl";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A shared library could not be opened, or lacks a symbol Helios needs.
    #[error("could not load {name} (tried {}): {detail}. {}", tried.join(", "), install_hint(name))]
    Library {
        /// [`LIBCUDA`] or [`LIBNCCL`].
        name: &'static str,
        /// The file names (or paths) handed to the dynamic loader, in order.
        tried: Vec<String>,
        detail: String,
    },

    /// A CUDA driver call returned an error code.
    #[error("{call} failed with {name} ({code}): {message}")]
    Cuda {
        call: &'static str,
        code: i32,
        /// `cuGetErrorName`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// `cuGetErrorString`.
        message: String,
    },

    /// An NCCL call returned an error code (or a communicator reported an asynchronous one).
    #[error(
        "{call} failed with NCCL error {code}: {message}; run with NCCL_DEBUG=WARN \
         (or INFO) to see NCCL's own account of the failure"
    )]
    Nccl {
        call: &'static str,
        code: i32,
        /// `ncclGetErrorString`, followed by `ncclGetLastError` where NCCL has one.
        message: String,
    },

    /// No CUDA device has the UUID asked for (a Vulkan device's `deviceUUID`).
    #[error(
        "no CUDA device has UUID {uuid}; CUDA sees {}. Pass the deviceUUID of a Vulkan device \
         on an NVIDIA GPU, and check that CUDA_VISIBLE_DEVICES does not hide that GPU from CUDA \
         (Vulkan ignores it)",
        seen_list(seen)
    )]
    NoDevice {
        /// The UUID asked for, formatted as `nvidia-smi -L` prints UUIDs.
        uuid: String,
        /// One line per device CUDA sees: ordinal, name and UUID.
        seen: Vec<String>,
    },

    /// An argument the library would reject or misuse, caught before the call.
    #[error("{call}: {detail}")]
    InvalidArgument { call: &'static str, detail: String },
}

fn install_hint(name: &str) -> &'static str {
    match name {
        LIBCUDA => {
            "libcuda.so.1 comes with the NVIDIA driver: install the driver and check that \
             `nvidia-smi` works; if the library lies outside the loader's search path, add its \
             directory to LD_LIBRARY_PATH"
        }
        LIBNCCL => {
            "Install NCCL: `pip install nvidia-nccl-cu12` (or nvidia-nccl-cu13, matching your \
             CUDA driver) and add the package's nvidia/nccl/lib directory to LD_LIBRARY_PATH, \
             or install NVIDIA's libnccl2 package"
        }
        _ => "add the library's directory to LD_LIBRARY_PATH",
    }
}

fn seen_list(seen: &[String]) -> String {
    if seen.is_empty() {
        "no devices".to_string()
    } else {
        seen.join("; ")
    }
}

/// Formats a device UUID as `nvidia-smi -L` does (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`),
/// so that messages can be compared with what the driver's tools print.
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_print_as_nvidia_smi_prints_them() {
        let uuid: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(
            format_uuid(&uuid),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }

    #[test]
    fn a_missing_library_message_says_what_was_tried_and_how_to_install() {
        let e = Error::Library {
            name: LIBNCCL,
            tried: vec!["libnccl.so.2".into(), "libnccl.so".into()],
            detail: "not found".into(),
        };
        let msg = e.to_string();
        assert!(msg.contains("libnccl.so.2, libnccl.so"), "{msg}");
        assert!(msg.contains("pip install nvidia-nccl-cu12"), "{msg}");
        assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
    }
}
