//! The trainer's side of data-parallel training: the ranks agree on the run, take rank 0's
//! starting state, and under ZeRO-1 (`TrainConfig::zero`) each keeps the optimizer state of
//! its own shard of the parameters.
//!
//! The ZeRO-1 step, which a reader must know: each gradient's sum goes to its owner only
//! (`Collective::reduce_gradients`), the owners sum their shares of the squared norm so
//! that every rank clips with the whole gradient's norm, each owner updates its parameters
//! (the same kernel, on the same values, as one process), and the updated parameters go
//! from their owners to every rank (`Collective::broadcast_owned`). The optimizer state
//! only meets in one place when a checkpoint is written: rank 0 gathers it from the owners
//! and writes today's format, which any number of ranks, sharded or not, resumes.

use std::borrow::Cow;
use std::collections::BTreeMap;

use helios::{DType, Tensor};
use helios_dist::{Collective, Shards};

use crate::checkpoint::OptimizerState;
use crate::config::GptConfig;
use crate::model::{device_rows, host_of, GptParams};
use crate::optim::AdamW;
use crate::params::{HostTensor, ParamStore};
use crate::phase::{Phase, Span};
use crate::sampler::Shard;
use crate::{Error, Result, Tokens};

/// This rank's slice of every batch.
pub(crate) fn shard_of(comm: &dyn Collective) -> Shard {
    let r = comm.rank();
    Shard {
        rank: r.rank,
        ranks: r.world,
    }
}

/// Fails on every rank unless all ranks run the same model, data and `settings` (the
/// training settings and the starting step, as text): a rank that differed would train
/// something else, or wait for ever.
pub(crate) fn agree_on_run(
    comm: &mut dyn Collective,
    init: &ParamStore,
    train: &Tokens,
    settings: String,
) -> Result<()> {
    if comm.rank().world == 1 {
        return Ok(());
    }
    let model = crate::config::to_hf_json(init.config()).to_string();
    let data = format!("{} {:016x}", train.len(), train.fingerprint());
    for (what, text) in [
        ("the model configuration", model),
        ("the training settings", settings),
        ("the training data", data),
    ] {
        comm.agree(what, crate::hash::fnv1a64(text.as_bytes()))?;
    }
    Ok(())
}

/// Rank 0's tensors, on every rank.
pub(crate) fn broadcast_tensors(
    comm: &mut dyn Collective,
    tensors: &BTreeMap<String, HostTensor>,
) -> Result<BTreeMap<String, HostTensor>> {
    let mut out = tensors.clone();
    for t in out.values_mut() {
        comm.broadcast_f32(&mut t.data)?;
    }
    Ok(out)
}

/// Rank 0's weights, on every rank (borrowed, not copied, in a run of one).
pub(crate) fn broadcast_store<'a>(
    comm: &mut dyn Collective,
    store: &'a ParamStore,
) -> Result<Cow<'a, ParamStore>> {
    if comm.rank().world == 1 {
        return Ok(Cow::Borrowed(store));
    }
    let tensors = store.clone().into_tensors();
    let tensors = broadcast_tensors(comm, &tensors)?;
    Ok(Cow::Owned(ParamStore::from_tensors(
        store.config(),
        tensors,
    )?))
}

/// Which rank owns which parameters under ZeRO-1 in a run of `world` ranks: contiguous runs
/// of `param_specs`, balanced by the device tensors' elements (`Shards::balanced`).
pub fn zero_shards(config: &GptConfig, world: usize) -> Result<Shards> {
    let sizes: Vec<usize> = config
        .param_specs()
        .iter()
        .map(|s| device_rows(s) * s.shape.iter().skip(1).product::<usize>())
        .collect();
    Ok(Shards::balanced(&sizes, world)?)
}

/// One ZeRO-1 optimizer step on the gradients backward left in `params` (see the module's
/// note); `unscale` is 1/(S·N) with loss scale S (f16) over N ranks, and `loss` this rank's
/// (1,) loss. Returns the gradient norm before clipping and the loss summed over the ranks,
/// (1,) device tensors the same on every rank, and the spans of its collectives and of its
/// optimizer work (`phase`).
pub(crate) fn sharded_step(
    opt: &mut AdamW,
    params: &GptParams,
    comm: &mut dyn Collective,
    shards: &Shards,
    lr: f64,
    unscale: Option<f32>,
    loss: &Tensor,
) -> Result<(Tensor, Tensor, Vec<Span>, Vec<Span>)> {
    let device = params.tensors()[0].device().clone();
    let t = Phase::start(&device);
    comm.reduce_gradients(params.tensors(), shards)?;
    let reduce = t.stop(&device)?;
    let t = Phase::start(&device);
    // This rank's share of the squared norm, summed over the ranks with the loss (on the GPU
    // over NCCL, else on the host in f64 rounded once to f32). Its order of summation is not
    // one process's, so a sharded run matches one process within rounding, not bit for bit;
    // a world of one sums the very same f32, and matches bit for bit.
    let share = match opt.owned_sum_squares(params)? {
        Some(s) => s,
        None => Tensor::from_slice(&device, &[0.0f32], &[1])?,
    };
    let both = Tensor::cat(&[&share, loss], 0)?;
    let squares = t.stop(&device)?;
    let t = Phase::start(&device);
    let sums = comm.sum_f32(&both)?;
    let summed = t.stop(&device)?;
    let t = Phase::start(&device);
    let norm = sums.narrow(0, 0, 1)?.sqrt()?;
    let norm = opt.step_owned(params, lr, unscale, norm)?;
    let update = t.stop(&device)?;
    let t = Phase::start(&device);
    comm.broadcast_owned(params.tensors(), shards)?;
    let broadcast = t.stop(&device)?;
    let total = sums.narrow(0, 1, 1)?;
    Ok((
        norm,
        total,
        vec![reduce, summed, broadcast],
        vec![squares, update],
    ))
}

/// The f32 weights and, with `moments`, the whole optimizer state, on rank 0 (`None` on the
/// other ranks), each shard's part sent by its owner: a collective every rank calls.
pub(crate) fn gather(
    opt: &AdamW,
    params: &GptParams,
    comm: &mut dyn Collective,
    shards: &Shards,
    moments: bool,
) -> Result<Option<(ParamStore, Option<OptimizerState>)>> {
    let me = comm.rank().rank;
    let config = params.config();
    // In f32 every rank holds every weight; narrower runs keep f32 masters in the shards.
    let masters = params.tensors()[0].dtype() != DType::F32;
    let (mut m, mut v, mut w) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for (i, spec) in config.param_specs().into_iter().enumerate() {
        let owner = shards.owner(i).ok_or_else(|| {
            Error::Params(format!("the shards give parameter {} no owner", spec.name))
        })?;
        let mine = opt.state_of(i);
        let parts = [
            (moments, &mut m, 0),
            (moments, &mut v, 1),
            (masters, &mut w, 2),
        ];
        for (wanted, map, k) in parts {
            if !wanted {
                continue;
            }
            let local = mine.and_then(|(m, v, master)| [Some(m), Some(v), master][k]);
            let mut data = match local {
                Some(t) => host_of(&spec, t)?.data,
                None => vec![0.0; spec.shape.iter().product()],
            };
            // Sent to every rank (the one broadcast every backend has), one tensor at a time:
            // a rank holds at most one foreign tensor on the host.
            if owner != 0 {
                comm.broadcast_f32_from(owner, &mut data)?;
            }
            if me == 0 {
                map.insert(
                    spec.name.clone(),
                    HostTensor::new(spec.shape.clone(), data)?,
                );
            }
        }
    }
    if me != 0 {
        return Ok(None);
    }
    let weights = match masters {
        true => ParamStore::from_tensors(config, w)?,
        false => params.download()?,
    };
    let state = moments.then_some(OptimizerState {
        step: opt.step,
        m,
        v,
    });
    Ok(Some((weights, state)))
}
