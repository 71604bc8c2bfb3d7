use helios::Tensor;

use crate::{Collective, Rank, Result, Shards};

/// A run of one process: every collective is the identity.
#[derive(Clone, Copy, Debug, Default)]
pub struct Single;

impl Collective for Single {
    fn rank(&self) -> Rank {
        Rank::SINGLE
    }

    fn backend(&self) -> &'static str {
        "single"
    }

    fn broadcast_from(&mut self, root: usize, _bytes: &mut [u8]) -> Result<()> {
        crate::check_root(root, 1)
    }

    fn mean(&mut self, _values: &mut [f64]) -> Result<()> {
        Ok(())
    }

    fn sum_f32(&mut self, values: &Tensor) -> Result<Tensor> {
        Ok(values.clone())
    }

    fn sum_gradients(&mut self, _tensors: &[Tensor], loss: &Tensor) -> Result<Tensor> {
        crate::check_loss(loss)?;
        Ok(loss.clone())
    }

    fn reduce_gradients(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()> {
        shards.check(tensors.len(), 1)
    }

    fn broadcast_owned(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()> {
        shards.check(tensors.len(), 1)
    }
}
