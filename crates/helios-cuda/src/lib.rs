//! helios-cuda: the CUDA driver API and NCCL, loaded at run time, for data-parallel training.
//!
//! Helios computes on Vulkan; to all-reduce gradients across GPUs it imports Vulkan memory
//! (an opaque fd from `VK_KHR_external_memory_fd`) and a Vulkan timeline semaphore into CUDA,
//! and runs NCCL collectives on that memory, ordered against Vulkan's work on the GPU:
//! a [`Stream`] waits for the semaphore value backward signals, all-reduces, and signals a value
//! the optimizer's Vulkan submit waits for.
//!
//! **Run-time loading.** `libcuda` and `libnccl` are opened with `dlopen` when [`Cuda::load`]
//! and [`Nccl::load`] are called, never linked: Helios builds, and its CPU tests pass, on a
//! machine without CUDA, and a missing library is an [`Error::Library`] that says how to get
//! it. The symbol table is our own and small (about 40 entry points), which keeps RCCL within
//! reach later.
//!
//! **Library names.** `libcuda.so.1`, then `libcuda.so` (the NVIDIA driver installs them);
//! `libnccl.so.2`, then `libnccl.so` (pip's `nvidia-nccl-cu12`/`-cu13` wheels or NVIDIA's
//! `libnccl2` package). The dynamic loader searches `LD_LIBRARY_PATH` first, then its cache
//! and the system directories, so a pip-installed NCCL is found by adding its
//! `site-packages/nvidia/nccl/lib` directory to `LD_LIBRARY_PATH` (or use [`Nccl::load_from`]).
//!
//! **Threads and contexts.** CUDA's current context is per thread. Helios uses each device's
//! primary context (the one the CUDA runtime, and so NCCL, uses), and every call here that
//! needs it makes it current on the calling thread first, so objects may be used from any
//! thread. A [`Comm`] must not be used by two threads at once (it is `Send`, not `Sync`).
//!
//! - `cuda`: [`Cuda`], [`CudaDevice`] (found by the Vulkan device's UUID), [`Context`].
//! - `stream`: [`Stream`], [`ExternalSemaphore`] (a Vulkan timeline semaphore).
//! - `memory`: [`DevicePtr`], [`DeviceBuffer`], [`ExternalMemory`] (a Vulkan allocation).
//! - `nccl`: [`Nccl`], [`UniqueId`], [`Comm`] and its collectives; which calls block the host.
//! - `cuda_sys`, `nccl_sys`: the C types, parameter structs and symbol tables.

mod cuda;
mod cuda_sys;
mod error;
mod library;
mod memory;
mod nccl;
mod nccl_sys;
mod stream;

pub use cuda::{Context, Cuda, CudaDevice};
pub use error::{format_uuid, Error, Result, LIBCUDA, LIBNCCL};
pub use memory::{DeviceBuffer, DevicePtr, ExternalMemory};
pub use nccl::{Comm, Nccl, NcclDtype, NcclOp, NcclVersion, UniqueId};
pub use stream::{ExternalSemaphore, Stream};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_that_is_not_there_is_a_library_error_naming_every_name_tried() {
        let names = ["libhelios-no-such-cuda.so.1", "libhelios-no-such-cuda.so"];
        match Cuda::load_from_names(&names) {
            Err(Error::Library {
                name,
                tried,
                detail,
            }) => {
                assert_eq!(name, LIBCUDA);
                assert_eq!(tried, names);
                assert!(detail.contains("libhelios-no-such-cuda.so.1"), "{detail}");
            }
            other => panic!("expected Error::Library, got {:?}", other.err()),
        }
    }
}
