//! Training hyperparameters that a checkpoint must carry for a run to resume exactly: the
//! learning-rate schedule (linear warm-up, then cosine decay, as llm.c and nanoGPT do) and
//! AdamW's constants. The schedule is a pure function of the step, so "the schedule's
//! position" is the step the trainer state records.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Linear warm-up from max_lr/warmup to max_lr over `warmup_steps`, then a cosine from
/// `max_lr` down to `min_lr` at `total_steps`, `min_lr` after that.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub max_lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
}

impl LrSchedule {
    /// A constant learning rate.
    pub fn constant(lr: f64) -> LrSchedule {
        LrSchedule {
            max_lr: lr,
            min_lr: lr,
            warmup_steps: 0,
            total_steps: 0,
        }
    }

    /// The learning rate of step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.max_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        if step >= self.total_steps {
            return self.min_lr;
        }
        let span = (self.total_steps - self.warmup_steps) as f64;
        let progress = (step - self.warmup_steps) as f64 / span;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.min_lr + cosine * (self.max_lr - self.min_lr)
    }

    pub fn validate(&self) -> Result<()> {
        let ok = self.max_lr.is_finite()
            && self.min_lr.is_finite()
            && self.max_lr >= 0.0
            && (0.0..=self.max_lr).contains(&self.min_lr);
        if !ok {
            return Err(Error::Config(format!(
                "learning rates must be finite with 0 <= min_lr ({}) <= max_lr ({})",
                self.min_lr, self.max_lr
            )));
        }
        if self.total_steps > 0 && self.warmup_steps > self.total_steps {
            return Err(Error::Config(format!(
                "warm-up ({} steps) is longer than the run ({} steps)",
                self.warmup_steps, self.total_steps
            )));
        }
        Ok(())
    }
}

/// AdamW's constants (the learning rate comes from the schedule). Weight decay applies to the
/// parameters whose `ParamSpec::weight_decay` is set: the matrices.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWHyper {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global gradient-norm clip; `None` for no clipping.
    pub grad_clip: Option<f64>,
}

impl Default for AdamWHyper {
    /// GPT-2 / GPT-3 training's choices, as in llm.c: betas (0.9, 0.95), eps 1e-8, weight
    /// decay 0.1, clip at 1.0.
    fn default() -> Self {
        AdamWHyper {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: Some(1.0),
        }
    }
}
