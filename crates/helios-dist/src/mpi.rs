//! The MPI backend: for GPUs without NCCL, and for CI. Gradients travel through the host
//! (read back, reduced by MPI, uploaded), which is slow but works on any Vulkan device.

use helios::Tensor;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, Equivalence, Root};

use crate::{Collective, Error, Rank, Result};

/// MPI counts are C ints: larger buffers go in pieces of this many elements.
const PIECE: usize = 1 << 28;

pub struct Mpi {
    world: SimpleCommunicator,
    rank: Rank,
    /// Finalizes MPI when dropped, which `finish` does; `None` after it.
    universe: Option<Universe>,
}

impl Drop for Mpi {
    fn drop(&mut self) {
        // Dropped without `finish`: a rank failed. MPI_Finalize would wait for ranks that
        // may be stuck in a collective with it; leave MPI up for `abort` instead.
        if let Some(u) = self.universe.take() {
            std::mem::forget(u);
        }
    }
}

/// `MPI_Abort` on the whole job, when MPI is up.
pub fn abort(code: i32) {
    if mpi::environment::is_initialized() && !mpi::environment::is_finalized() {
        // mpiexec forwards each rank's output through its own pipes and stops forwarding
        // once a rank aborts: let it pass on the error just printed first (a CI run lost it).
        std::thread::sleep(std::time::Duration::from_millis(300));
        // SAFETY: MPI is initialised and not finalised; MPI_Abort takes the world
        // communicator and does not return.
        unsafe {
            mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
        }
    }
}

impl Mpi {
    /// Joins the MPI job that started this process; `rank` (from the launcher's variables)
    /// must agree with what MPI says.
    pub fn init(rank: Rank) -> Result<Mpi> {
        let universe = mpi::initialize().ok_or_else(|| {
            Error::Mpi("MPI was already initialised in this process; connect once".into())
        })?;
        let world = universe.world();
        let (r, n) = (world.rank() as usize, world.size() as usize);
        if (r, n) != (rank.rank, rank.world) {
            return Err(Error::Mpi(format!(
                "MPI says this is rank {r} of {n}, the environment rank {} of {}: the \
                 launcher and the MPI library do not match (start with the mpiexec of the MPI \
                 this helios was built against)",
                rank.rank, rank.world
            )));
        }
        Ok(Mpi {
            world,
            rank,
            universe: Some(universe),
        })
    }

    /// Sums `values` over the ranks into rank 0, then sends rank 0's sums to all: unlike an
    /// all-reduce, whose summation order may differ per rank, every rank gets the same bits.
    fn sum_everywhere<T: Equivalence + Copy + Default>(&self, values: &mut [T]) {
        let root = self.world.process_at_rank(0);
        for piece in values.chunks_mut(PIECE) {
            if self.rank.rank == 0 {
                let mut sum = vec![T::default(); piece.len()];
                root.reduce_into_root(&piece[..], &mut sum[..], SystemOperation::sum());
                piece.copy_from_slice(&sum);
            } else {
                root.reduce_into(&piece[..], SystemOperation::sum());
            }
            root.broadcast_into(piece);
        }
    }
}

impl Collective for Mpi {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn broadcast(&mut self, bytes: &mut [u8]) -> Result<()> {
        let root = self.world.process_at_rank(0);
        for piece in bytes.chunks_mut(PIECE) {
            root.broadcast_into(piece);
        }
        Ok(())
    }

    fn mean(&mut self, values: &mut [f64]) -> Result<()> {
        self.sum_everywhere(values);
        let n = self.rank.world as f64;
        values.iter_mut().for_each(|v| *v /= n);
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        drop(self.universe.take());
        Ok(())
    }

    fn average_gradients(&mut self, tensors: &[Tensor]) -> Result<()> {
        let grads = crate::gradients(tensors)?;
        let mut flat = Vec::with_capacity(grads.iter().map(Tensor::len).sum());
        for g in &grads {
            flat.extend(g.to_vec()?);
        }
        self.sum_everywhere(&mut flat);
        let scale = 1.0 / self.rank.world as f32;
        let mut at = 0;
        for (t, g) in tensors.iter().zip(&grads) {
            let mean: Vec<f32> = flat[at..at + g.len()].iter().map(|v| v * scale).collect();
            at += g.len();
            t.set_grad(Some(Tensor::from_slice_as(
                g.device(),
                &mean,
                g.shape(),
                g.dtype(),
            )?))?;
        }
        Ok(())
    }
}
