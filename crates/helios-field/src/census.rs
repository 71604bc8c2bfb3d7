//! Instruction census of the multipliers (tests only): SPIR-V operations per Montgomery
//! product of each layout, from the difference between a kernel with two dependent products
//! and one with one (so loads, stores and the conversions around the multiplier cancel).
//!
//! The one decision a reader must know: the GPU's own instructions cannot be seen here, so
//! the census is a proxy, reported twice: raw SPIR-V operations, and a weighted count that
//! charges what a 32-bit ISA pays (a 64-bit add, subtract, shift or compare is two
//! instructions; conversions and bitcasts between 32- and 64-bit are free; a u32×u32→u64
//! multiply-add is one). It guards the multipliers against growth.

use std::collections::BTreeMap;

use helios_spirv::{Access, Binding, KernelBuilder, Scalar};

use crate::arith::{Arith, Layout};
use crate::kernel::{first_vector, load_element, store_element};

/// Operation counts ("OpName:bits" → count) of a kernel doing `products` dependent
/// Montgomery products in the layout's multiplier form.
fn kernel_ops(layout: Layout, products: usize) -> BTreeMap<String, i64> {
    let mut k = KernelBuilder::new("census", Binding::DeviceAddress, [64, 1, 1]);
    let a = k.buffer("a", Scalar::U32, Access::Read);
    let b = k.buffer("b", Scalar::U32, Access::Read);
    let out = k.buffer("out", Scalar::U32, Access::Write);
    k.begin();
    let i = k.local_index();
    let first = first_vector(&mut k, i);
    let xa = load_element(&mut k, a, first);
    let xb = load_element(&mut k, b, first);
    let mut ar = Arith { k: &mut k, layout };
    let (mut x, y) = (ar.enter_mul_form(&xa), ar.enter_mul_form(&xb));
    for _ in 0..products {
        x = ar.mont_mul_form(&x, &y);
    }
    let r = ar.leave_mul_form(&x);
    store_element(&mut k, out, first, &r);
    let text = k.finish().disassemble();
    census(&text)
}

/// Counts the function body's operations by opcode and result width.
fn census(text: &str) -> BTreeMap<String, i64> {
    let mut widths: BTreeMap<&str, u32> = BTreeMap::new();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(id), Some("="), Some(op)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let args: Vec<&str> = parts.collect();
        match op {
            "OpTypeInt" | "OpTypeFloat" => {
                widths.insert(id, args[0].parse().unwrap_or(32));
            }
            "OpTypeVector" => {
                let w = widths.get(args[0]).copied().unwrap_or(32);
                widths.insert(id, w);
            }
            _ if op.starts_with("OpType") || op.starts_with("OpConstant") => {}
            "OpVariable" | "OpAccessChain" | "OpLoad" | "OpLabel" => {}
            _ => {
                let bits = args
                    .first()
                    .and_then(|t| widths.get(t))
                    .copied()
                    .unwrap_or(0);
                *counts.entry(format!("{op}:{bits}")).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// Per-product operation counts of a layout.
pub(crate) fn per_product(layout: Layout) -> BTreeMap<String, i64> {
    let (one, two) = (kernel_ops(layout, 1), kernel_ops(layout, 2));
    let mut d = two;
    for (op, n) in one {
        *d.entry(op).or_insert(0) -= n;
    }
    d.retain(|_, n| *n != 0);
    d
}

/// (SPIR-V operations, weighted 32-bit-ISA instructions) per product.
pub(crate) fn cost(layout: Layout) -> (i64, i64) {
    let ops = per_product(layout);
    let raw = ops.values().sum();
    let weighted = ops
        .iter()
        .map(|(op, &n)| {
            let (name, bits) = op.split_once(':').unwrap_or((op, "32"));
            let w = match (name, bits) {
                ("OpUConvert" | "OpSConvert" | "OpBitcast" | "OpCompositeExtract", _) => 0,
                ("OpCompositeConstruct", _) => 0,
                ("OpIMul", "64") => 1, // u32×u32 zero-extended: one wide multiply(-add)
                (_, "64") => 2,
                _ => 1,
            };
            n * w
        })
        .sum();
    (raw, weighted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prints the census (`cargo test -p helios-field census -- --nocapture`) and holds the
    /// multipliers to it: today's per-product counts are ceilings.
    #[test]
    fn multipliers_stay_within_their_census() {
        // (layout, SPIR-V operations, weighted) per product, as measured when written.
        let ceilings = [
            (Layout::Comba30KH, 1480, 1192),
            (Layout::Comba30K2H, 1429, 1197),
        ];
        for (layout, max_raw, max_weighted) in ceilings {
            let (raw, weighted) = cost(layout);
            println!("{:10} raw {raw:5} weighted {weighted:5}", layout.name());
            println!("   {:?}", per_product(layout));
            assert!(raw <= max_raw, "{}: {raw} > {max_raw}", layout.name());
            assert!(weighted <= max_weighted, "{}", layout.name());
        }
        // The product-scanning multipliers perform exactly the 32×32→64 multiplies their
        // radix promises (Karatsuba levels) and n 32-bit ones.
        for layout in Layout::ALL {
            let Some(r) = layout.radix() else { continue };
            let ops = per_product(layout);
            let wide = ops.get("OpIMul:64").copied();
            assert_eq!(wide, Some(r.multiplies() as i64), "{}", layout.name());
            assert_eq!(ops.get("OpIMul:32").copied(), Some(r.n() as i64));
        }
    }
}
