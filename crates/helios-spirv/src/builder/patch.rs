//! Rewrites of an assembled module's words for instructions the `rspirv` in use predates:
//! the fused multiply-adds (`fma`) and the tensor-addressing placeholders (`tensor`).
//! Instructions are a plain word stream (no offsets), so changing them in place is safe.

use std::collections::HashMap;

use rspirv::spirv::{GLOp, Op, Word};

/// `OpFmaKHR`'s opcode and the `FMAKHR` capability (SPV_KHR_fma).
pub(crate) const OP_FMA_KHR: u32 = 4427;
pub(crate) const CAPABILITY_FMA_KHR: u32 = 6030;
const EXTENSION: &str = "SPV_KHR_fma";

/// The module `words` with the GLSL `Fma` instructions whose results are `ids` turned into
/// `OpFmaKHR`, and the capability and extension declared. Instructions are a plain word
/// stream (no offsets), so shortening some is safe.
pub(crate) fn fused_fma(words: &[u32], ids: &[Word]) -> Vec<u32> {
    let mut out = Vec::with_capacity(words.len() + 6);
    out.extend_from_slice(&words[..5]);
    let mut declared = false;
    let mut at = 5;
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        let inst = &words[at..at + count];
        if !declared && op != Op::Capability as u32 {
            out.extend([2 << 16 | Op::Capability as u32, CAPABILITY_FMA_KHR]);
            let mut name: Vec<u8> = EXTENSION.bytes().collect();
            name.resize((EXTENSION.len() / 4 + 1) * 4, 0); // NUL-terminated, padded
            out.push(((1 + name.len() / 4) as u32) << 16 | Op::Extension as u32);
            out.extend(
                name.chunks(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
            declared = true;
        }
        // OpExtInst: type, result, set, instruction, a, b, c.
        if op == Op::ExtInst as u32
            && count == 8
            && inst[4] == GLOp::Fma as u32
            && ids.contains(&inst[2])
        {
            out.extend([
                6 << 16 | OP_FMA_KHR,
                inst[1],
                inst[2],
                inst[5],
                inst[6],
                inst[7],
            ]);
        } else {
            out.extend_from_slice(inst);
        }
        at += count;
    }
    out
}

/// The module `words` with every placeholder of `raw` given its real opcode. A placeholder
/// is an `OpNop` with operands whose result id (second word of an untyped instruction, third
/// of a typed one) is in `raw`.
pub(crate) fn placeholders(words: &[u32], raw: &HashMap<Word, (u32, bool)>) -> Vec<u32> {
    let mut out = words.to_vec();
    let mut at = 5;
    while at < out.len() {
        let (count, op) = ((out[at] >> 16) as usize, out[at] & 0xffff);
        if op == Op::Nop as u32 && count > 1 {
            let typed = count > 2 && matches!(raw.get(&out[at + 2]), Some((_, true)));
            let untyped = matches!(raw.get(&out[at + 1]), Some((_, false)));
            let real = if typed {
                raw[&out[at + 2]].0
            } else if untyped {
                raw[&out[at + 1]].0
            } else {
                panic!("an OpNop with operands that is no placeholder at word {at}")
            };
            out[at] = (count as u32) << 16 | real;
        }
        at += count.max(1);
    }
    out
}
