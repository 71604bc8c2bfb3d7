//! NCCL as Helios uses it: types, enum values and the symbol table, following `nccl.h`.
//!
//! The table is small on purpose: the same ~20 entry points exist in RCCL, so another library
//! name list is all an AMD port would need here.

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library;

use crate::cuda_sys::CuStream;
use crate::error::{Error, Result, LIBNCCL};
use crate::library::Loader;

pub(crate) type NcclResult = c_int;
pub(crate) type NcclComm = *mut c_void;

pub(crate) const NCCL_SUCCESS: NcclResult = 0;
/// `ncclInProgress`: only non-blocking communicators report it; Helios makes blocking ones.
pub(crate) const NCCL_IN_PROGRESS: NcclResult = 7;

/// `NCCL_UNIQUE_ID_BYTES`.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: `struct { char internal[128]; }`, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct NcclUniqueId {
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// `ncclDataType_t` and `ncclRedOp_t` are C enums: `int` on the ABIs NCCL supports.
pub(crate) type NcclDataType = c_int;
pub(crate) type NcclRedOp = c_int;

/// The NCCL entry points Helios calls, resolved once.
pub(crate) struct NcclApi {
    pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub get_unique_id: unsafe extern "C" fn(*mut NcclUniqueId) -> NcclResult,
    pub comm_init_rank:
        unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int) -> NcclResult,
    pub comm_destroy: unsafe extern "C" fn(NcclComm) -> NcclResult,
    pub comm_abort: unsafe extern "C" fn(NcclComm) -> NcclResult,
    pub comm_get_async_error: unsafe extern "C" fn(NcclComm, *mut NcclResult) -> NcclResult,
    pub comm_count: unsafe extern "C" fn(NcclComm, *mut c_int) -> NcclResult,
    pub comm_user_rank: unsafe extern "C" fn(NcclComm, *mut c_int) -> NcclResult,
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        NcclComm,
        CuStream,
    ) -> NcclResult,
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        c_int,
        NcclComm,
        CuStream,
    ) -> NcclResult,
    pub reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        c_int,
        NcclComm,
        CuStream,
    ) -> NcclResult,
    pub reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        NcclComm,
        CuStream,
    ) -> NcclResult,
    pub all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclComm,
        CuStream,
    ) -> NcclResult,
    pub group_start: unsafe extern "C" fn() -> NcclResult,
    pub group_end: unsafe extern "C" fn() -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    /// NCCL 2.13+: the text of the last failure, much more telling than the code's string.
    pub get_last_error: Option<unsafe extern "C" fn(NcclComm) -> *const c_char>,
    /// Keeps the code behind the pointers above mapped.
    _lib: Library,
}

/// The names tried for NCCL, in order: the soname pip's and NVIDIA's packages install, then
/// the development symlink.
pub(crate) const LIBNCCL_NAMES: &[&str] = &["libnccl.so.2", "libnccl.so"];

impl NcclApi {
    pub(crate) fn load(names: &[&str]) -> Result<NcclApi> {
        let l = Loader::open(LIBNCCL, names)?;
        // SAFETY: each type below is the C declaration in nccl.h of the symbol it is resolved
        // from, with enums as int and cudaStream_t as a pointer.
        unsafe {
            Ok(NcclApi {
                get_version: l.get(&["ncclGetVersion"])?,
                get_unique_id: l.get(&["ncclGetUniqueId"])?,
                comm_init_rank: l.get(&["ncclCommInitRank"])?,
                comm_destroy: l.get(&["ncclCommDestroy"])?,
                comm_abort: l.get(&["ncclCommAbort"])?,
                comm_get_async_error: l.get(&["ncclCommGetAsyncError"])?,
                comm_count: l.get(&["ncclCommCount"])?,
                comm_user_rank: l.get(&["ncclCommUserRank"])?,
                all_reduce: l.get(&["ncclAllReduce"])?,
                broadcast: l.get(&["ncclBroadcast"])?,
                reduce: l.get(&["ncclReduce"])?,
                reduce_scatter: l.get(&["ncclReduceScatter"])?,
                all_gather: l.get(&["ncclAllGather"])?,
                group_start: l.get(&["ncclGroupStart"])?,
                group_end: l.get(&["ncclGroupEnd"])?,
                get_error_string: l.get(&["ncclGetErrorString"])?,
                get_last_error: l.get_optional(&["ncclGetLastError"]),
                _lib: l.into_library(),
            })
        }
    }

    /// `Ok` for `ncclSuccess`, else [`Error::Nccl`] with NCCL's description of `code` and, where
    /// NCCL has one, its last error message for `comm` (null for calls without a communicator).
    pub(crate) fn check(&self, call: &'static str, code: NcclResult, comm: NcclComm) -> Result<()> {
        if code == NCCL_SUCCESS {
            return Ok(());
        }
        Err(self.error(call, code, comm))
    }

    pub(crate) fn error(&self, call: &'static str, code: NcclResult, comm: NcclComm) -> Error {
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let mut message = unsafe { text((self.get_error_string)(code)) }
            .unwrap_or_else(|| "unknown NCCL error".to_string());
        if let Some(last) = self.get_last_error {
            // SAFETY: ncclGetLastError takes a communicator or NULL and returns a string NCCL
            // keeps (thread-local), valid until the next NCCL call on this thread.
            if let Some(last) = unsafe { text(last(comm)) }.filter(|s| !s.is_empty()) {
                message = format!("{message} ({last})");
            }
        }
        Error::Nccl {
            call,
            code,
            message,
        }
    }
}

/// A C string as an owned `String`; `None` for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
unsafe fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        Some(CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unique_id_is_128_bytes_of_char() {
        assert_eq!(std::mem::size_of::<NcclUniqueId>(), 128);
        assert_eq!(std::mem::align_of::<NcclUniqueId>(), 1);
    }
}
