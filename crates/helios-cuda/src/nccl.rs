//! NCCL communicators and collectives on device memory, queued on a [`Stream`].
//!
//! What blocks the calling thread:
//! - [`Comm::init_rank`] blocks until all `world` ranks have called it with the same id.
//! - Collectives return once queued on the stream; inside a group ([`Nccl::group_start`])
//!   nothing is queued until [`Nccl::group_end`]. Wait for results with [`Stream::synchronize`]
//!   or order later work on the GPU ([`Stream::signal_external`]).
//! - Dropping a [`Comm`] (`ncclCommDestroy`) waits for its queued collectives, which needs every
//!   peer to be alive: when a peer has died, call [`Comm::abort`] instead.

use std::ffi::c_int;
use std::sync::Arc;

use crate::cuda::Context;
use crate::error::{Error, Result, LIBNCCL};
use crate::memory::DevicePtr;
use crate::nccl_sys::{
    NcclApi, NcclComm, NcclUniqueId, LIBNCCL_NAMES, NCCL_IN_PROGRESS, NCCL_SUCCESS, UNIQUE_ID_BYTES,
};
use crate::stream::Stream;

/// The loaded NCCL library. Cheap to clone.
#[derive(Clone)]
pub struct Nccl {
    api: Arc<NcclApi>,
    version: NcclVersion,
}

/// NCCL's version, from `ncclGetVersion`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl NcclVersion {
    /// Decodes `NCCL_VERSION_CODE`: `X*1000 + Y*100 + Z` up to 2.8, `X*10000 + Y*100 + Z` after.
    pub(crate) fn from_code(code: u32) -> NcclVersion {
        let (major, rest) = if code >= 10000 {
            (code / 10000, code % 10000)
        } else {
            (code / 1000, code % 1000)
        };
        NcclVersion {
            major,
            minor: rest / 100,
            patch: rest % 100,
        }
    }
}

impl std::fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// `ncclAvg` and `ncclBfloat16` arrived in NCCL 2.10.
const V2_10: NcclVersion = NcclVersion {
    major: 2,
    minor: 10,
    patch: 0,
};

impl Nccl {
    /// Opens `libnccl.so.2` (then `libnccl.so`) through the dynamic loader's search path,
    /// LD_LIBRARY_PATH first.
    pub fn load() -> Result<Nccl> {
        Self::load_names(LIBNCCL_NAMES)
    }

    /// Opens NCCL from an explicit path, e.g. the `libnccl.so.2` inside a Python environment's
    /// `nvidia/nccl/lib` directory (a name without '/' is searched for, as by `load`).
    pub fn load_from(path: &std::path::Path) -> Result<Nccl> {
        let path = path.to_str().ok_or_else(|| Error::Library {
            name: LIBNCCL,
            tried: vec![path.to_string_lossy().into_owned()],
            detail: "the path is not valid UTF-8; move the library to a UTF-8 path".to_string(),
        })?;
        Self::load_names(&[path])
    }

    pub(crate) fn load_names(names: &[&str]) -> Result<Nccl> {
        let api = NcclApi::load(names)?;
        let mut code: c_int = 0;
        // SAFETY: writes one int.
        api.check(
            "ncclGetVersion",
            unsafe { (api.get_version)(&mut code) },
            std::ptr::null_mut(),
        )?;
        Ok(Nccl {
            api: Arc::new(api),
            version: NcclVersion::from_code(code.max(0) as u32),
        })
    }

    pub fn version(&self) -> NcclVersion {
        self.version
    }

    /// Starts a group: collectives until [`Nccl::group_end`] are queued together (needed when
    /// one thread drives several communicators; fuses launches otherwise).
    pub fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments.
        let code = unsafe { (self.api.group_start)() };
        self.api.check("ncclGroupStart", code, std::ptr::null_mut())
    }

    /// Ends a group, queueing its collectives.
    pub fn group_end(&self) -> Result<()> {
        // SAFETY: no arguments.
        let code = unsafe { (self.api.group_end)() };
        self.api.check("ncclGroupEnd", code, std::ptr::null_mut())
    }

    /// Runs `f` between `group_start` and `group_end`; the group is ended even if `f` fails,
    /// and `f`'s error comes first.
    pub fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        self.group_start()?;
        let result = f();
        let end = self.group_end();
        let value = result?;
        end.map(|()| value)
    }

    fn require(&self, what: &str, needed: NcclVersion, call: &'static str) -> Result<()> {
        if self.version >= needed {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                call,
                detail: format!(
                    "{what} needs NCCL {needed} or newer but the loaded NCCL is {}; \
                     install a newer NCCL (see Nccl::load)",
                    self.version
                ),
            })
        }
    }
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("version", &self.version)
            .finish()
    }
}

/// The id every rank of one communicator starts from: made once (rank 0), then handed to the
/// others, e.g. as hex through an environment variable or a file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// A fresh id (`ncclGetUniqueId`; it also starts NCCL's bootstrap listener here).
    pub fn new(nccl: &Nccl) -> Result<UniqueId> {
        let mut raw = NcclUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: writes one ncclUniqueId.
        let code = unsafe { (nccl.api.get_unique_id)(&mut raw) };
        nccl.api
            .check("ncclGetUniqueId", code, std::ptr::null_mut())?;
        Ok(UniqueId(raw.internal.map(|c| c as u8)))
    }

    pub fn from_bytes(bytes: [u8; UNIQUE_ID_BYTES]) -> UniqueId {
        UniqueId(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// 256 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses what [`UniqueId::to_hex`] wrote; surrounding whitespace (a file's trailing
    /// newline) is ignored.
    pub fn from_hex(hex: &str) -> Result<UniqueId> {
        let hex = hex.trim();
        let bad = |detail: String| Error::InvalidArgument {
            call: "UniqueId::from_hex",
            detail: format!(
                "{detail}; an NCCL unique id is {} hex digits, as UniqueId::to_hex writes it",
                2 * UNIQUE_ID_BYTES
            ),
        };
        if hex.len() != 2 * UNIQUE_ID_BYTES {
            return Err(bad(format!("got {} characters", hex.len())));
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(hi), Some(lo)) => bytes[i] = (hi * 16 + lo) as u8,
                _ => {
                    return Err(bad(format!(
                        "characters {}..{} are not hex digits",
                        2 * i,
                        2 * i + 2
                    )))
                }
            }
        }
        Ok(UniqueId(bytes))
    }

    fn to_raw(self) -> NcclUniqueId {
        NcclUniqueId {
            internal: self.0.map(|b| b as _),
        }
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({}…)", &self.to_hex()[..16])
    }
}

/// Element types (`ncclDataType_t`; values from nccl.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NcclDtype {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    /// NCCL 2.10+.
    Bf16 = 9,
}

impl NcclDtype {
    pub fn size_bytes(self) -> usize {
        match self {
            NcclDtype::I8 | NcclDtype::U8 => 1,
            NcclDtype::F16 | NcclDtype::Bf16 => 2,
            NcclDtype::I32 | NcclDtype::U32 | NcclDtype::F32 => 4,
            NcclDtype::I64 | NcclDtype::U64 | NcclDtype::F64 => 8,
        }
    }
}

/// Reductions (`ncclRedOp_t`; values from nccl.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NcclOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    /// The sum divided by the world size; NCCL 2.10+.
    Avg = 4,
}

/// One rank's communicator.
///
/// Not `Sync`: NCCL forbids using one communicator from two threads at once. It may move
/// between threads; each call makes its context current first.
///
/// # Safety of the collectives
/// The collectives take raw [`DevicePtr`]s and are `unsafe`: the caller promises that each
/// pointer addresses at least the stated number of elements in memory of this communicator's
/// context (a [`crate::DeviceBuffer`], or a buffer mapped from [`crate::ExternalMemory`]), and
/// that the memory stays alive until the stream has finished the collective. NCCL reads and
/// writes it on the GPU after the call returns.
pub struct Comm {
    api: Arc<NcclApi>,
    nccl: Nccl,
    ctx: Context,
    /// Null once aborted.
    raw: NcclComm,
    world: usize,
    rank: usize,
}

// SAFETY: an NCCL communicator may be used from another thread as long as no two threads use
// it at once, which `&self` methods on a non-`Sync` type guarantee.
unsafe impl Send for Comm {}

impl Comm {
    /// Joins communicator `id` as rank `rank` of `world`, on `ctx`'s device. Blocks until all
    /// ranks have joined. `world` ranks must call this, each with its own rank.
    pub fn init_rank(
        nccl: &Nccl,
        ctx: &Context,
        world: usize,
        id: &UniqueId,
        rank: usize,
    ) -> Result<Comm> {
        if world == 0 || rank >= world || world > c_int::MAX as usize {
            return Err(Error::InvalidArgument {
                call: "Comm::init_rank",
                detail: format!(
                    "rank {rank} of world {world} is not a rank: the world needs at least one \
                     rank and ranks count from 0 to world - 1"
                ),
            });
        }
        // NCCL picks the device of the calling thread's current context.
        ctx.make_current()?;
        let api = &nccl.api;
        let mut raw: NcclComm = std::ptr::null_mut();
        // SAFETY: writes one communicator; the id is passed by value as nccl.h declares.
        let code =
            unsafe { (api.comm_init_rank)(&mut raw, world as c_int, id.to_raw(), rank as c_int) };
        api.check("ncclCommInitRank", code, raw)?;
        let comm = Comm {
            api: api.clone(),
            nccl: nccl.clone(),
            ctx: ctx.clone(),
            raw,
            world,
            rank,
        };
        let (mut count, mut user_rank): (c_int, c_int) = (0, 0);
        // SAFETY: `raw` is a live communicator; each call writes one int.
        unsafe {
            api.check("ncclCommCount", (api.comm_count)(raw, &mut count), raw)?;
            api.check(
                "ncclCommUserRank",
                (api.comm_user_rank)(raw, &mut user_rank),
                raw,
            )?;
        }
        if count as usize != world || user_rank as usize != rank {
            return Err(Error::InvalidArgument {
                call: "Comm::init_rank",
                detail: format!(
                    "NCCL made rank {user_rank} of {count} where rank {rank} of {world} was \
                     asked for; every rank must pass the same world size"
                ),
            });
        }
        Ok(comm)
    }

    pub fn world(&self) -> usize {
        self.world
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Reduces `count` elements of `send` across ranks with `op`, leaving the result in every
    /// rank's `recv` (`send == recv` works in place). Returns once queued on `stream`.
    ///
    /// # Safety
    /// See [`Comm`]: `send` and `recv` hold `count` elements of `dtype` each.
    pub unsafe fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: NcclDtype,
        op: NcclOp,
        stream: &Stream,
    ) -> Result<()> {
        let raw = self.prepare("Comm::all_reduce", dtype, Some(op), stream)?;
        let code = (self.api.all_reduce)(
            send.as_ptr(),
            recv.as_ptr(),
            count,
            dtype as c_int,
            op as c_int,
            raw,
            stream.raw(),
        );
        self.api.check("ncclAllReduce", code, raw)
    }

    /// Copies `count` elements from rank `root`'s `send` to every rank's `recv`.
    ///
    /// # Safety
    /// See [`Comm`]: `recv` (and `send` on the root) hold `count` elements of `dtype`.
    pub unsafe fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: NcclDtype,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let raw = self.prepare("Comm::broadcast", dtype, None, stream)?;
        let root = self.root("Comm::broadcast", root)?;
        let code = (self.api.broadcast)(
            send.as_ptr(),
            recv.as_ptr(),
            count,
            dtype as c_int,
            root,
            raw,
            stream.raw(),
        );
        self.api.check("ncclBroadcast", code, raw)
    }

    /// Reduces `count` elements of `send` across ranks with `op` into rank `root`'s `recv`
    /// (`send == recv` works in place; other ranks' `recv` is not written).
    ///
    /// # Safety
    /// See [`Comm`]: `send` (and `recv` on the root) hold `count` elements of `dtype`.
    #[allow(clippy::too_many_arguments)] // ncclReduce's own arguments, plus the stream
    pub unsafe fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: NcclDtype,
        op: NcclOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let raw = self.prepare("Comm::reduce", dtype, Some(op), stream)?;
        let root = self.root("Comm::reduce", root)?;
        let code = (self.api.reduce)(
            send.as_ptr(),
            recv.as_ptr(),
            count,
            dtype as c_int,
            op as c_int,
            root,
            raw,
            stream.raw(),
        );
        self.api.check("ncclReduce", code, raw)
    }

    /// Reduces `world * recv_count` elements of `send` with `op` and leaves block `rank` of the
    /// result (`recv_count` elements) in `recv`.
    ///
    /// # Safety
    /// See [`Comm`]: `send` holds `world * recv_count` elements, `recv` holds `recv_count`.
    pub unsafe fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: NcclDtype,
        op: NcclOp,
        stream: &Stream,
    ) -> Result<()> {
        let raw = self.prepare("Comm::reduce_scatter", dtype, Some(op), stream)?;
        let code = (self.api.reduce_scatter)(
            send.as_ptr(),
            recv.as_ptr(),
            recv_count,
            dtype as c_int,
            op as c_int,
            raw,
            stream.raw(),
        );
        self.api.check("ncclReduceScatter", code, raw)
    }

    /// Gathers `send_count` elements from every rank into `recv`, rank `i`'s at block `i`.
    ///
    /// # Safety
    /// See [`Comm`]: `send` holds `send_count` elements, `recv` holds `world * send_count`.
    pub unsafe fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: NcclDtype,
        stream: &Stream,
    ) -> Result<()> {
        let raw = self.prepare("Comm::all_gather", dtype, None, stream)?;
        let code = (self.api.all_gather)(
            send.as_ptr(),
            recv.as_ptr(),
            send_count,
            dtype as c_int,
            raw,
            stream.raw(),
        );
        self.api.check("ncclAllGather", code, raw)
    }

    /// `Err` if a collective failed after it was queued (a peer died, a network error). Poll it
    /// while waiting on a stream that may never finish; on error, [`Comm::abort`].
    pub fn async_error(&self) -> Result<()> {
        let raw = self.live("Comm::async_error")?;
        let mut state = NCCL_SUCCESS;
        // SAFETY: `raw` is a live communicator; writes one ncclResult_t.
        let code = unsafe { (self.api.comm_get_async_error)(raw, &mut state) };
        self.api.check("ncclCommGetAsyncError", code, raw)?;
        if state == NCCL_SUCCESS || state == NCCL_IN_PROGRESS {
            Ok(())
        } else {
            Err(self
                .api
                .error("a queued collective (ncclCommGetAsyncError)", state, raw))
        }
    }

    /// Tears the communicator down without waiting for peers, abandoning queued collectives:
    /// the way out when a peer has died (dropping would wait for it).
    pub fn abort(mut self) -> Result<()> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() {
            return Ok(());
        }
        // Abort even if the context cannot be made current: NCCL selects its device itself,
        // and a communicator left alive would keep waiting for the dead peer.
        let current = self.ctx.make_current();
        // SAFETY: `raw` is a live communicator, not used after this (the field is now null).
        let code = unsafe { (self.api.comm_abort)(raw) };
        self.api
            .check("ncclCommAbort", code, std::ptr::null_mut())?;
        current
    }

    /// Checks what NCCL would misreport or not check, makes the context current and returns
    /// the communicator.
    fn prepare(
        &self,
        call: &'static str,
        dtype: NcclDtype,
        op: Option<NcclOp>,
        stream: &Stream,
    ) -> Result<NcclComm> {
        let raw = self.live(call)?;
        stream.check_same_context(&self.ctx, call)?;
        if dtype == NcclDtype::Bf16 {
            self.nccl.require("bf16 (ncclBfloat16)", V2_10, call)?;
        }
        if op == Some(NcclOp::Avg) {
            self.nccl.require("ncclAvg", V2_10, call)?;
        }
        self.ctx.make_current()?;
        Ok(raw)
    }

    /// `root` as NCCL takes it, if it is a rank of this world.
    fn root(&self, call: &'static str, root: usize) -> Result<c_int> {
        if root >= self.world {
            return Err(Error::InvalidArgument {
                call,
                detail: format!("root {root} is not a rank of this world of {}", self.world),
            });
        }
        Ok(root as c_int)
    }

    fn live(&self, call: &'static str) -> Result<NcclComm> {
        if self.raw.is_null() {
            Err(Error::InvalidArgument {
                call,
                detail: "the communicator was aborted; make a new one".to_string(),
            })
        } else {
            Ok(self.raw)
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        // Nothing can be reported from drop; without a current context NCCL cannot free the
        // communicator's device memory, so skip rather than crash.
        if self.ctx.make_current().is_ok() {
            // SAFETY: `raw` is a live communicator, not used after this.
            let _ = unsafe { (self.api.comm_destroy)(self.raw) };
        }
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("aborted", &self.raw.is_null())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_id() -> UniqueId {
        UniqueId::from_bytes(std::array::from_fn(|i| (i * 37 + 5) as u8))
    }

    #[test]
    fn a_unique_id_survives_a_hex_round_trip() {
        let id = sample_id();
        let hex = id.to_hex();
        assert_eq!(hex.len(), 256);
        assert_eq!(UniqueId::from_hex(&hex).unwrap(), id);
        assert_eq!(UniqueId::from_hex(&format!("{hex}\n")).unwrap(), id);
        assert_eq!(UniqueId::from_hex(&hex.to_uppercase()).unwrap(), id);
    }

    #[test]
    fn a_unique_id_rejects_bad_hex_with_a_message() {
        let hex = sample_id().to_hex();
        let short = UniqueId::from_hex(&hex[..254]).unwrap_err().to_string();
        assert!(short.contains("got 254 characters"), "{short}");
        assert!(short.contains("256 hex digits"), "{short}");

        let mut bad = hex.clone();
        bad.replace_range(10..11, "g");
        let msg = UniqueId::from_hex(&bad).unwrap_err().to_string();
        assert!(msg.contains("characters 10..12"), "{msg}");

        // 256 bytes but not 256 characters: must not split a multi-byte character.
        let wide = "é".repeat(128);
        assert!(UniqueId::from_hex(&wide).is_err());
        assert!(UniqueId::from_hex("").is_err());
    }

    #[test]
    fn version_codes_decode_on_both_sides_of_2_9() {
        let v = |major, minor, patch| NcclVersion {
            major,
            minor,
            patch,
        };
        assert_eq!(NcclVersion::from_code(2804), v(2, 8, 4));
        assert_eq!(NcclVersion::from_code(21003), v(2, 10, 3));
        assert_eq!(NcclVersion::from_code(22703), v(2, 27, 3));
        assert_eq!(v(2, 27, 3).to_string(), "2.27.3");
        assert!(NcclVersion::from_code(2804) < V2_10);
        assert!(NcclVersion::from_code(21003) >= V2_10);
    }

    #[test]
    fn enum_values_match_nccl_h() {
        assert_eq!(NcclDtype::I8 as i32, 0);
        assert_eq!(NcclDtype::F16 as i32, 6);
        assert_eq!(NcclDtype::F32 as i32, 7);
        assert_eq!(NcclDtype::F64 as i32, 8);
        assert_eq!(NcclDtype::Bf16 as i32, 9);
        assert_eq!(NcclOp::Sum as i32, 0);
        assert_eq!(NcclOp::Max as i32, 2);
        assert_eq!(NcclOp::Avg as i32, 4);
        assert_eq!(NcclDtype::Bf16.size_bytes(), 2);
    }
}
