//! One AdamW step in f64, as `torch.optim.AdamW` defines it: the semantics the fused kernel
//! promises.
//!
//! `p ← p·(1 − lr·wd)`, `m ← β1·m + (1−β1)·g`, `v ← β2·v + (1−β2)·g²`,
//! `p ← p − lr/(1−β1^t) · m / (√v / √(1−β2^t) + ε)`; NaN in g gives NaN in p, m and v.

use crate::AdamWConfig;

/// Updates `param`, `m` and `v` in place (f64 arithmetic, each result rounded once to f32):
/// step `step` with the hyper-parameters of `config` and the tensor's `weight_decay`, as
/// `adamw_step` takes them.
pub fn adamw(
    param: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    config: &AdamWConfig,
    weight_decay: f32,
    step: u32,
) {
    let AdamWConfig {
        lr,
        beta1,
        beta2,
        eps,
    } = *config;
    let (lr, b1, b2) = (f64::from(lr), f64::from(beta1), f64::from(beta2));
    let (eps, wd) = (f64::from(eps), f64::from(weight_decay));
    let t = step as i32;
    let bc1 = 1.0 - b1.powi(t);
    let bc2 = 1.0 - b2.powi(t);
    for i in 0..param.len() {
        let g = f64::from(grad[i]);
        let mi = b1 * f64::from(m[i]) + (1.0 - b1) * g;
        let vi = b2 * f64::from(v[i]) + (1.0 - b2) * g * g;
        let p = f64::from(param[i]) * (1.0 - lr * wd);
        let p = p - lr / bc1 * mi / (vi.sqrt() / bc2.sqrt() + eps);
        param[i] = p as f32;
        m[i] = mi as f32;
        v[i] = vi as f32;
    }
}
