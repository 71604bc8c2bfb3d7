//! Data-parallel training over several processes, one GPU each: which rank a process is
//! (`Rank`, from its launcher's variables), the collective operations the trainer needs
//! (`Collective`), the backends that carry them — NCCL on NVIDIA GPUs, MPI anywhere else —
//! and `launch`, which starts the ranks for `helios train --nproc N`.
//!
//! The rule a reader must know: every rank runs the same program on the same data, and every
//! collective is called by every rank in the same order. The ranks then hold bit-identical
//! parameters after every step (gradients are summed to identical bits, and every kernel is
//! deterministic), so nothing but gradients, losses and the starting weights ever needs to
//! travel. Under ZeRO-1 (`Shards`) each rank keeps the optimizer state of its own shard of
//! the parameters: gradients then travel to their owner only, and updated parameters from
//! their owner to every rank, which again leaves every rank with the same bits.
//!
//! How the modules relate: `env` reads the launcher's variables into a `Rank` (and the
//! crate's `HELIOS_*` switches); `device` picks that rank's Vulkan device; `nccl`, `mpi` and
//! `single` are the `Collective` backends, each call under `guard`'s deadline, and joining
//! under `watchdog`'s; `shard` splits the parameters for ZeRO-1 over any backend; `launch`
//! starts the ranks of `--nproc` and stops them all when one fails.

mod device;
mod env;
mod error;
mod guard;
pub mod launch;
#[cfg(feature = "mpi")]
mod mpi;
pub mod nccl;
mod shard;
mod single;
mod watchdog;

use helios::Tensor;

pub use device::device_for;
pub use env::{Launcher, Rank};
pub use error::{Error, Result};
pub use nccl::NcclCollective;
pub use shard::Shards;
pub use single::Single;

/// The operations data-parallel training needs, carried by one backend. Every rank calls
/// each of them, in the same order, with arguments of the same sizes.
pub trait Collective {
    /// This process's place in the run.
    fn rank(&self) -> Rank;

    /// The backend's name, for logs: "nccl", "mpi" or "single".
    fn backend(&self) -> &'static str;

    /// Every rank's `bytes` become rank `root`'s.
    fn broadcast_from(&mut self, root: usize, bytes: &mut [u8]) -> Result<()>;

    /// Every rank's `bytes` become rank 0's.
    fn broadcast(&mut self, bytes: &mut [u8]) -> Result<()> {
        self.broadcast_from(0, bytes)
    }

    /// Every rank's `values` become their element-wise mean over the ranks (the same bits
    /// on every rank).
    fn mean(&mut self, values: &mut [f64]) -> Result<()>;

    /// The sum over the ranks of every rank's `values`, a (k,) f32 device tensor of a few
    /// values (a squared norm, a loss): a device tensor with the same bits on every rank. By
    /// default the host reads `values` back and sums in f64, rounding to f32 once; NCCL sums
    /// on the GPU, and the host does not wait.
    fn sum_f32(&mut self, values: &Tensor) -> Result<Tensor> {
        let mut v: Vec<f64> = values.to_vec()?.into_iter().map(f64::from).collect();
        self.mean(&mut v)?;
        let world = self.rank().world as f64;
        let sums: Vec<f32> = v.iter().map(|m| (m * world) as f32).collect();
        Ok(Tensor::from_slice(values.device(), &sums, &[sums.len()])?)
    }

    /// Every tensor's gradient becomes the sum of that gradient over the ranks, the same bits
    /// on every rank (the trainer divides by the number of ranks as the optimizer reads
    /// them); each tensor must hold a gradient. `loss`, a (1,) f32 device tensor, travels in
    /// the same exchange: the result is its sum over the ranks. So the ranks meet once a
    /// step.
    fn sum_gradients(&mut self, tensors: &[Tensor], loss: &Tensor) -> Result<Tensor>;

    /// ZeRO-1's first half: on the rank that owns a tensor under `shards`, its gradient
    /// becomes the sum of that gradient over the ranks; the other ranks' gradient of it is
    /// left as it was (only the owner updates the tensor). Each tensor must hold a gradient.
    fn reduce_gradients(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()>;

    /// ZeRO-1's second half, after each owner updated its tensors: every rank's tensors take
    /// their owner's values, written in place (the same bits on every rank).
    fn broadcast_owned(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()>;

    /// The run is over on every rank: shut the backend down in step with the others (MPI
    /// finalizes). A collective dropped without `finish` — after a failure — leaves the
    /// backend up rather than wait for ranks that may never come; call `abort` then.
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// `loss` must be a (1,) f32 tensor, as `Collective::sum_gradients` takes it.
pub(crate) fn check_loss(loss: &Tensor) -> Result<()> {
    match loss.shape() == [1] && loss.dtype() == helios::DType::F32 {
        true => Ok(()),
        false => Err(Error::Environment(format!(
            "the loss that travels with the gradients is a (1,) f32 tensor, not {:?} {:?}",
            loss.shape(),
            loss.dtype()
        ))),
    }
}

/// Every tensor's gradient (an error names the first without one).
pub(crate) fn gradients(tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.grad().ok_or_else(|| {
                Error::Environment(format!(
                    "tensor {i} of {} has no gradient to average; call backward() first",
                    tensors.len()
                ))
            })
        })
        .collect()
}

/// `root` must be a rank of a world of `world`.
pub(crate) fn check_root(root: usize, world: usize) -> Result<()> {
    match root < world {
        true => Ok(()),
        false => Err(Error::Environment(format!(
            "a broadcast from rank {root} in a run of {world} ranks: ranks count from 0"
        ))),
    }
}

/// Stops this rank's whole run after a failure, with exit status `code`: under MPI through
/// `MPI_Abort` (the launcher stops every rank), otherwise by exiting (`helios train --nproc`
/// stops the others when one fails). Print the error first.
pub fn abort(code: i32) -> ! {
    #[cfg(feature = "mpi")]
    mpi::abort(code);
    std::process::exit(code)
}

impl dyn Collective + '_ {
    /// Checks that every rank has the same `value` (a fingerprint of `what`): every rank
    /// fails together, naming the first that differs, so none is left waiting in a
    /// collective for ranks that stopped.
    pub fn agree(&mut self, what: &str, value: u64) -> Result<()> {
        let mut first = value.to_le_bytes();
        self.broadcast(&mut first)?;
        let me = self.rank();
        let mismatch = u64::from_le_bytes(first) != value;
        // The mean of one-hot rank flags: 0 when all agree, else it names a rank that does not.
        let mut flags = vec![0.0; me.world];
        flags[me.rank] = f64::from(u8::from(mismatch));
        self.mean(&mut flags)?;
        match flags.iter().position(|&f| f > 0.0) {
            None => Ok(()),
            Some(rank) => Err(Error::Disagree {
                rank,
                what: what.to_string(),
            }),
        }
    }

    /// Every rank's `values` become rank 0's.
    pub fn broadcast_f32(&mut self, values: &mut [f32]) -> Result<()> {
        self.broadcast_f32_from(0, values)
    }

    /// Every rank's `values` become rank `root`'s.
    pub fn broadcast_f32_from(&mut self, root: usize, values: &mut [f32]) -> Result<()> {
        let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.broadcast_from(root, &mut bytes)?;
        for (v, b) in values.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }
}

/// The collective for this process's rank, on `device` (from `device_for`): a `Single` when
/// the process runs alone; NCCL where the device can share memory with CUDA and NCCL loads
/// (found through MPI under `mpiexec`, else through `NCCL_COMM_ID`); MPI otherwise under
/// `mpiexec`. An error says what is missing. Joining and every call after have a deadline
/// (`HELIOS_DIST_TIMEOUT`, 600 s): past it the run stops with an error naming the call.
pub fn connect(device: &helios::Device, rank: Rank) -> Result<Box<dyn Collective>> {
    if rank.world == 1 {
        return Ok(Box::new(Single));
    }
    // Joining waits for every other rank: not for ever.
    let timeout = watchdog::join_timeout()?;
    let _deadline = watchdog::Watchdog::arm(timeout, move || {
        let line = format!(
            "error: rank {} of {}: the other ranks did not join within {} s (one failed \
             before connecting, or they were started with other settings); stopping \
             (HELIOS_DIST_TIMEOUT sets the wait)\n",
            rank.rank,
            rank.world,
            timeout.as_secs()
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        abort(1)
    });
    let inner = connect_now(device, rank)?;
    // And so does every collective call after.
    Ok(Box::new(guard::Guarded::new(inner, timeout, move |op| {
        let line = format!(
            "error: rank {} of {}: a collective ({op}) did not finish within {} s: another \
             rank stopped or took another path; stopping (HELIOS_DIST_TIMEOUT sets the wait)\n",
            rank.rank,
            rank.world,
            timeout.as_secs()
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        abort(1)
    })))
}

fn connect_now(device: &helios::Device, rank: Rank) -> Result<Box<dyn Collective>> {
    match rank.launcher {
        Launcher::None => Ok(Box::new(Single)),
        Launcher::Env => match NcclCollective::connect(device, rank, None) {
            Ok(c) => Ok(Box::new(c)),
            Err(e) => Err(Error::Unsupported(format!(
                "rank {} of {} was started without MPI (RANK/WORLD_SIZE), so it needs NCCL, \
                 which cannot run here: {e}. Start the ranks with `mpiexec -n {}` and a build \
                 with `--features mpi` instead",
                rank.rank, rank.world, rank.world
            ))),
        },
        Launcher::Mpi => {
            let bootstrap = mpi_backend(rank)?;
            let shares = device.context().enabled().export_memory
                && device.context().enabled().export_timeline;
            match shares && nccl::available(1).is_ok() {
                true => Ok(Box::new(NcclCollective::connect(
                    device,
                    rank,
                    Some(bootstrap),
                )?)),
                false => Ok(bootstrap),
            }
        }
    }
}

#[cfg(feature = "mpi")]
fn mpi_backend(rank: Rank) -> Result<Box<dyn Collective>> {
    Ok(Box::new(mpi::Mpi::init(rank)?))
}

#[cfg(not(feature = "mpi"))]
fn mpi_backend(rank: Rank) -> Result<Box<dyn Collective>> {
    Err(Error::Unsupported(format!(
        "rank {} of {} was started by an MPI launcher, but this helios was built without \
         MPI: build it with `cargo build --release --features mpi` (which needs MPICH: \
         `apt-get install mpich libmpich-dev libclang-dev`)",
        rank.rank, rank.world
    )))
}

/// Whether this build carries the MPI backend.
pub const HAS_MPI: bool = cfg!(feature = "mpi");
