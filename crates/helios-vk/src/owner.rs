//! How the objects made on a Context (buffers, exported memory, timelines, pipelines, native
//! kernels) hold it: as `Arc<dyn Owner>`. Holding the Context itself keeps its lifetime rule
//! (it drops after its objects, so its teardown runs as it always did), and the trait lets
//! their modules use it without naming `Context`, which holds them in its batches and queues.

use crate::core::Core;
use crate::error::Result;
use crate::pool::Pools;

/// What those objects use of their Context; `Context` is the one implementation (context.rs).
pub(crate) trait Owner: Send + Sync {
    /// The device core.
    fn core(&self) -> &Core;

    /// The pools buffers return their regions to, where exported allocations are counted.
    fn pools(&self) -> &Pools;

    /// `Context::wait`: blocks until the compute timeline reaches `value`.
    fn wait(&self, value: u64) -> Result<()>;

    /// `Context::wait_copies`: blocks until the transfer timeline reaches `value`.
    fn wait_copies(&self, value: u64) -> Result<()>;
}
