//! The MPI backend: for GPUs without NCCL, and for CI. Gradients travel through the host
//! (read back, reduced by MPI, uploaded), which is slow but works on any Vulkan device.
//! Sums go to one rank and back out from it, never through an all-reduce, so that every
//! rank gets the same bits whatever algorithm the MPI library picks.

use helios::Tensor;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, Equivalence, Root};

use crate::{Collective, Error, Rank, Result, Shards};

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
        self.sum_into(0, values);
        self.broadcast_into(0, values);
    }

    /// Sums `values` over the ranks into rank `to`'s `values`; the others' are left alone.
    fn sum_into<T: Equivalence + Copy + Default>(&self, to: usize, values: &mut [T]) {
        let root = self.world.process_at_rank(to as i32);
        for piece in values.chunks_mut(PIECE) {
            if self.rank.rank == to {
                let mut sum = vec![T::default(); piece.len()];
                root.reduce_into_root(&piece[..], &mut sum[..], SystemOperation::sum());
                piece.copy_from_slice(&sum);
            } else {
                root.reduce_into(&piece[..], SystemOperation::sum());
            }
        }
    }

    /// Rank `from`'s `values` become every rank's.
    fn broadcast_into<T: Equivalence>(&self, from: usize, values: &mut [T]) {
        let root = self.world.process_at_rank(from as i32);
        for piece in values.chunks_mut(PIECE) {
            root.broadcast_into(piece);
        }
    }
}

/// Every tensor's values as f32, one after another, and where each starts (one more entry:
/// the end).
fn flatten(tensors: &[Tensor]) -> Result<(Vec<f32>, Vec<usize>)> {
    let mut flat = Vec::with_capacity(tensors.iter().map(Tensor::len).sum());
    let mut starts = Vec::with_capacity(tensors.len() + 1);
    for t in tensors {
        starts.push(flat.len());
        flat.extend(t.to_vec()?);
    }
    starts.push(flat.len());
    Ok((flat, starts))
}

/// Sets `t`'s gradient to `sums` (the ranks' sum of gradient `g`, flattened), in `g`'s shape
/// and dtype.
fn set_sum_grad(t: &Tensor, g: &Tensor, sums: &[f32]) -> Result<()> {
    let grad = Tensor::from_slice_as(g.device(), sums, g.shape(), g.dtype())?;
    t.set_grad(Some(grad))?;
    Ok(())
}

impl Collective for Mpi {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn broadcast_from(&mut self, root: usize, bytes: &mut [u8]) -> Result<()> {
        crate::check_root(root, self.rank.world)?;
        self.broadcast_into(root, bytes);
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

    fn sum_gradients(&mut self, tensors: &[Tensor], loss: &Tensor) -> Result<Tensor> {
        crate::check_loss(loss)?;
        let mut grads = crate::gradients(tensors)?;
        grads.push(loss.clone());
        let (mut flat, starts) = flatten(&grads)?;
        self.sum_everywhere(&mut flat);
        for (i, t) in tensors.iter().enumerate() {
            set_sum_grad(t, &grads[i], &flat[starts[i]..starts[i + 1]])?;
        }
        let total = flat[starts[tensors.len()]];
        Ok(Tensor::from_slice(loss.device(), &[total], &[1])?)
    }

    fn reduce_gradients(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()> {
        shards.check(tensors.len(), self.rank.world)?;
        let grads = crate::gradients(tensors)?;
        // Every rank's whole gradient leaves it, but each part reaches its owner only: half
        // of what `sum_gradients` moves, the other half being `broadcast_owned`.
        let (mut flat, starts) = flatten(&grads)?;
        for r in 0..self.rank.world {
            let owned = shards.range(r);
            let (a, b) = (starts[owned.start], starts[owned.end]);
            if a < b {
                self.sum_into(r, &mut flat[a..b]);
            }
        }
        for i in shards.range(self.rank.rank) {
            let sums = &flat[starts[i]..starts[i + 1]];
            set_sum_grad(&tensors[i], &grads[i], sums)?;
        }
        Ok(())
    }

    fn broadcast_owned(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()> {
        shards.check(tensors.len(), self.rank.world)?;
        for r in 0..self.rank.world {
            let owned = &tensors[shards.range(r)];
            if owned.is_empty() {
                continue;
            }
            // f32 on the wire: exact for every dtype a tensor has.
            let (mut flat, starts) = match r == self.rank.rank {
                true => flatten(owned)?,
                false => {
                    let mut starts = vec![0];
                    starts.extend(owned.iter().scan(0, |at, t| {
                        *at += t.len();
                        Some(*at)
                    }));
                    (vec![0.0; starts[owned.len()]], starts)
                }
            };
            self.broadcast_into(r, &mut flat);
            if r == self.rank.rank {
                continue;
            }
            for (k, t) in owned.iter().enumerate() {
                let values = &flat[starts[k]..starts[k + 1]];
                Tensor::from_slice_as(t.device(), values, t.shape(), t.dtype())?.copy_into(t)?;
            }
        }
        Ok(())
    }
}
