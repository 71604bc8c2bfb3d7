//! Which invocation holds which element of a 16×16 cooperative matrix, learnt from the device.
//!
//! SPV_KHR_cooperative_matrix leaves the element-to-invocation mapping to the implementation,
//! so a portable kernel cannot, say, take the row maximum of an accumulator without a trip
//! through shared memory. Yet FlashAttention's whole trick is to keep the scores in the
//! registers that the matrix unit wrote them to: row max and row sum with two shuffles, the
//! exponentials in place, and P handed to the next product as an A operand without moving.
//!
//! So Helios asks the device. [`CoopProbeKernel`] loads matrices whose elements are their own
//! coordinates (r·16 + c) as A, B and accumulator fragments and writes out what each invocation
//! holds at each element index. [`FragMap::recognise`] accepts the mapping when it has the
//! structure register-resident softmax needs, the same for every invocation:
//! - an accumulator's elements fall into *row slots*: elements in one slot share a row;
//! - the invocations holding the rest of a slot's row are `lane ^ m` for every `m` made of the
//!   bits of one mask (so a row reduction is a few `subgroupShuffleXor`s);
//! - an A fragment holds, in each invocation, exactly the elements the accumulator holds
//!   there, in a fixed permutation (so P moves from accumulator to A operand in registers).
//!
//! NVIDIA's mapping (the `mma.sync` register layout) has this structure; a device whose
//! mapping does not gets `None` and the kernels that stage scores in shared memory. What a
//! kernel needs at run time beyond the map (each element's row and column) it learns the
//! same way, from a coordinate fragment it loads itself.

use helios_spirv::{
    Access, Binding, CoopLayout, CoopMat, CoopStride, CoopTy, CoopUse, KernelBuilder, KernelModule,
    Scalar,
};

use crate::storage::Storage;

/// Fragment side the map describes.
pub const SIDE: u32 = 16;
/// Elements per invocation the map describes (16·16 over a subgroup of 32).
pub const LEN: usize = 8;
/// Invocations per subgroup the map describes.
pub const LANES: usize = 32;

/// The structure of a device's 16×16 fragments that register-resident attention relies on
/// (see the module docs). Element indices are those of `OpCompositeExtract`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragMap {
    /// A-fragment element `e` holds the same matrix element as accumulator element
    /// `a_from_acc[e]` (in every invocation).
    pub a_from_acc: [u8; LEN],
    /// Row slot of each accumulator element (slots numbered by first appearance).
    pub row_slot: [u8; LEN],
    pub row_slots: u8,
    /// The invocations sharing a slot's row are `lane ^ m` for every `m` with
    /// `m & !row_lanes == 0`.
    pub row_lanes: u8,
    /// Column slot of each accumulator element: elements of one slot share a column (in the
    /// worst case every element is its own slot).
    pub col_slot: [u8; LEN],
    pub col_slots: u8,
}

/// What the probe read back: for each invocation and element index, r·16 + c.
pub type Probed = [[u32; LEN]; LANES];

impl FragMap {
    /// The first element of row slot `s`.
    pub fn row_rep(&self, s: u8) -> usize {
        self.row_slot
            .iter()
            .position(|&x| x == s)
            .expect("every slot has an element")
    }

    /// The first element of column slot `s`.
    pub fn col_rep(&self, s: u8) -> usize {
        self.col_slot
            .iter()
            .position(|&x| x == s)
            .expect("every slot has an element")
    }

    /// The map of a device whose accumulator (f32) and A (16-bit) fragments read back as
    /// `acc` and `a`, or why register-resident softmax cannot use it.
    pub fn recognise(acc: &Probed, a: &Probed) -> Result<FragMap, String> {
        for (what, m) in [("accumulator", acc), ("A", a)] {
            let mut seen = [false; 256];
            for lane in m {
                for &x in lane {
                    if x >= 256 || std::mem::replace(&mut seen[x as usize], true) {
                        return Err(format!(
                            "the {what} fragment does not hold each element exactly once"
                        ));
                    }
                }
            }
        }
        let row = |l: usize, e: usize| acc[l][e] / SIDE;
        let col = |l: usize, e: usize| acc[l][e] % SIDE;
        // A from the accumulator: one permutation for every invocation.
        let mut a_from_acc = [0u8; LEN];
        for (e, slot) in a_from_acc.iter_mut().enumerate() {
            let Some(src) = acc[0].iter().position(|&x| x == a[0][e]) else {
                return Err("A and accumulator fragments spread elements differently".into());
            };
            *slot = src as u8;
        }
        for l in 0..LANES {
            for e in 0..LEN {
                if a[l][e] != acc[l][a_from_acc[e] as usize] {
                    return Err(
                        "the A-from-accumulator permutation depends on the invocation".into(),
                    );
                }
            }
        }
        let (row_slot, row_slots) =
            partition(row).ok_or("elements sharing a row differ between invocations")?;
        let (col_slot, col_slots) =
            partition(col).unwrap_or((std::array::from_fn(|e| e as u8), LEN as u8));
        // The invocations sharing lane 0's first row in slot 0 give the mask.
        let sharing: Vec<usize> = (0..LANES).filter(|&l| row(l, 0) == row(0, 0)).collect();
        let row_lanes = sharing.iter().fold(0usize, |m, &l| m | l);
        if row_lanes >= LANES || sharing.len() != 1 << row_lanes.count_ones() {
            return Err("the invocations sharing a row are not a set of lane bits".into());
        }
        for l in 0..LANES {
            for e in 0..LEN {
                let s = row_slot[e];
                for l2 in 0..LANES {
                    for (e2, &s2) in row_slot.iter().enumerate() {
                        let same_row = row(l2, e2) == row(l, e);
                        let partner = (l2 ^ l) & !row_lanes == 0 && s2 == s;
                        if same_row != partner {
                            return Err(format!(
                                "row {} is not held by slot {s} of the lanes {l} ^ {row_lanes:#b}",
                                row(l, e)
                            ));
                        }
                    }
                }
            }
        }
        Ok(FragMap {
            a_from_acc,
            row_slot,
            row_slots,
            row_lanes: row_lanes as u8,
            col_slot,
            col_slots,
        })
    }

    /// NVIDIA's `mma.sync` m16n8k16 layout, as its driver reports it (the map tests use;
    /// devices are always probed).
    pub fn nvidia_probe() -> (Probed, Probed) {
        let acc: Probed = std::array::from_fn(|l| {
            std::array::from_fn(|e| {
                let r = l / 4 + 8 * ((e / 2) % 2);
                let c = 2 * (l % 4) + e % 2 + 8 * (e / 4);
                (r * 16 + c) as u32
            })
        });
        (acc, acc)
    }
}

/// Groups the element indices by `key(lane, e)` when the grouping is the same in every
/// invocation: (slot of each element, number of slots).
fn partition(key: impl Fn(usize, usize) -> u32) -> Option<([u8; LEN], u8)> {
    let mut slot = [0u8; LEN];
    let mut n = 0u8;
    for e in 0..LEN {
        match (0..e).find(|&e2| key(0, e2) == key(0, e)) {
            Some(e2) => slot[e] = slot[e2],
            None => {
                slot[e] = n;
                n += 1;
            }
        }
    }
    let same = (0..LANES).all(|l| {
        (0..LEN).all(|e| (0..LEN).all(|e2| (key(l, e) == key(l, e2)) == (slot[e] == slot[e2])))
    });
    same.then_some((slot, n))
}

/// The probe: one subgroup loads coordinate matrices as A, B (both `input`) and accumulator
/// (f32) fragments and writes what each invocation holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopProbeKernel {
    pub input: Storage,
    pub subgroup: u32,
}

impl CoopProbeKernel {
    /// Words of the output: the three fragment lengths, then per fragment (A, B,
    /// accumulator) and invocation [`LEN`] coordinates (`u32::MAX` where the fragment is
    /// shorter).
    pub const OUT_WORDS: usize = 4 + 3 * LANES * LEN;

    pub fn name(&self) -> String {
        format!("coop_probe_{}", self.input.name())
    }

    /// Parameters: `h` (u32 words: the 16×16 coordinates r·16 + c as `input` halves,
    /// row-major), `f` (the same as f32), `out` (u32, [`Self::OUT_WORDS`]).
    pub fn build(&self) -> KernelModule {
        assert_eq!(
            self.subgroup as usize, LANES,
            "the probe is written for 32 lanes"
        );
        let mut k = KernelBuilder::new(self.name(), Binding::DeviceAddress, [self.subgroup, 1, 1]);
        let h = k.buffer("h", Scalar::U32, Access::Read);
        let f = k.buffer("f", Scalar::F32, Access::Read);
        let out = k.buffer("out", Scalar::U32, Access::Write);
        k.begin();
        let scalar = frag_scalar(self.input);
        let zero = k.u32(0);
        let half_row = k.u32(SIDE / 2);
        let row = k.u32(SIDE);
        let a_ty = CoopTy::new(scalar, SIDE, SIDE, CoopUse::A);
        let b_ty = CoopTy::new(scalar, SIDE, SIDE, CoopUse::B);
        let c_ty = CoopTy::new(Scalar::F32, SIDE, SIDE, CoopUse::Accumulator);
        let a = k.coop_load(
            a_ty,
            h,
            1,
            zero,
            CoopStride {
                stride: half_row,
                layout: CoopLayout::RowMajor,
            },
            16,
        );
        let b = k.coop_load(
            b_ty,
            h,
            1,
            zero,
            CoopStride {
                stride: half_row,
                layout: CoopLayout::RowMajor,
            },
            16,
        );
        let c = k.coop_load(
            c_ty,
            f,
            1,
            zero,
            CoopStride {
                stride: row,
                layout: CoopLayout::RowMajor,
            },
            16,
        );
        let lane = k.subgroup_invocation_id();
        let lenc = k.u32(LEN as u32);
        let mine = k.mul(lane, lenc);
        let frags: [CoopMat; 3] = [a, b, c];
        for (u, m) in frags.into_iter().enumerate() {
            let len = k.coop_length(m.ty);
            let is_first = k.eq(lane, zero);
            let slot = k.u32(u as u32);
            k.if_(is_first, |k| k.store(out, slot, len));
            for e in 0..LEN as u32 {
                let base = k.u32(4 + (u * LANES * LEN) as u32 + e);
                let at = k.add(mine, base);
                let ec = k.u32(e);
                let has = k.lt(ec, len);
                k.if_(has, |k| {
                    let x = k.coop_extract(m, e);
                    let x = k.convert(x, Scalar::F32);
                    let v = k.convert(x, Scalar::U32);
                    k.store(out, at, v);
                });
            }
        }
        k.finish()
    }

    /// Reads the output back into (A, accumulator) coordinates, or why not.
    pub fn parse(out: &[u32]) -> Result<(Probed, Probed), String> {
        if out.len() < Self::OUT_WORDS {
            return Err("short probe output".into());
        }
        if out[..3] != [LEN as u32; 3] {
            return Err(format!(
                "fragments hold {:?} elements per invocation, not {LEN}",
                &out[..3]
            ));
        }
        let read = |u: usize| -> Probed {
            std::array::from_fn(|l| std::array::from_fn(|e| out[4 + (u * LANES + l) * LEN + e]))
        };
        Ok((read(0), read(2)))
    }
}

/// The fragment component type of f16 or bf16 storage (what the cooperative kernels load).
pub(crate) fn frag_scalar(s: Storage) -> Scalar {
    match s {
        Storage::F16 => Scalar::F16,
        _ => Scalar::BF16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_layout_is_recognised() {
        let (acc, a) = FragMap::nvidia_probe();
        let m = FragMap::recognise(&acc, &a).expect("recognised");
        assert_eq!(m.a_from_acc, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(m.row_slots, 2);
        assert_eq!(m.row_slot, [0, 0, 1, 1, 0, 0, 1, 1]);
        assert_eq!(m.row_lanes, 0b11);
        assert_eq!(m.col_slots, 4);
        assert_eq!(m.col_slot, [0, 1, 0, 1, 2, 3, 2, 3]);
    }

    #[test]
    fn a_permutation_is_found() {
        let (acc, mut a) = FragMap::nvidia_probe();
        for lane in a.iter_mut() {
            lane.swap(0, 5);
        }
        let m = FragMap::recognise(&acc, &a).expect("recognised");
        assert_eq!(m.a_from_acc, [5, 1, 2, 3, 4, 0, 6, 7]);
    }

    #[test]
    fn unusable_layouts_are_refused() {
        let (acc, a) = FragMap::nvidia_probe();
        // A permutation that depends on the lane.
        let mut bad_a = a;
        bad_a[3].swap(0, 1);
        assert!(FragMap::recognise(&acc, &bad_a).is_err());
        // Rows spread over lanes that are not a set of lane bits: swap two lanes' data.
        let mut odd = acc;
        odd.swap(1, 4);
        let mut odd_a = a;
        odd_a.swap(1, 4);
        assert!(FragMap::recognise(&odd, &odd_a).is_err());
        // An element held twice.
        let mut twice = acc;
        twice[0][0] = twice[0][1];
        assert!(FragMap::recognise(&twice, &a).is_err());
        // Rows spread over a lane and its neighbour's other slot.
        let mut mixed = acc;
        let mut mixed_a = a;
        for m in [&mut mixed, &mut mixed_a] {
            let (x, y) = (m[0][2], m[1][0]);
            m[0][2] = y;
            m[1][0] = x;
        }
        assert!(FragMap::recognise(&mixed, &mixed_a).is_err());
    }

    #[test]
    fn the_probe_validates() {
        for input in [Storage::F16, Storage::BF16] {
            let m = CoopProbeKernel {
                input,
                subgroup: 32,
            }
            .build();
            if let Err(e) =
                helios_spirv::validate(&m.name, &m.words, helios_spirv::TargetEnv::Vulkan1_3)
            {
                panic!("{e}\n{}", m.disassemble());
            }
        }
    }
}
