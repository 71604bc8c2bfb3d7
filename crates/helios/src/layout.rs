//! `Layout`: where a tensor's elements lie in its buffer (shape, strides, offset, in elements).
//!
//! The one decision a reader must know: views are metadata. `transpose`, `permute`, `narrow`,
//! `broadcast_to` and contiguous `reshape` only compute a new `Layout` over the same buffer;
//! element-wise kernels read any layout directly (strides in push constants), and
//! `contiguous()` copies when a kernel needs row-major data. Strides are non-negative (no
//! flips), and a stride of 0 repeats an element (broadcast). Everything here is pure
//! arithmetic on sizes, tested without a GPU.

/// Sizes or strides, inline up to 6 dimensions.
pub(crate) type Dims = smallvec::SmallVec<[usize; 6]>;

/// Layouts a thread keeps in each of its caches, at most this many (then it starts over).
const LAYOUTS_CACHED: usize = 512;

thread_local! {
    /// The row-major layouts this thread made, by shape. A training step makes the same few
    /// hundred every step (each new node's and output's): a cached one costs a reference
    /// count where a new one cost an allocation and its free (a quarter of a 12-block
    /// step's ~4300 allocations were layouts).
    static ROW_MAJOR: Cache<Dims> = std::cell::RefCell::new(rustc_hash::FxHashMap::default());
    /// The other views this thread made (transposes, narrows, broadcasts), by shape,
    /// strides and offset: a step makes the same ones again too.
    static VIEWS: Cache<(Dims, Dims, usize)> =
        std::cell::RefCell::new(rustc_hash::FxHashMap::default());
}

/// Shape, strides and offset of a tensor view, in elements.
///
/// Shared and immutable: every element-wise op copies its inputs' layouts into its graph node
/// and usually gives its output the layout of its first input, so a copy is a reference
/// count, not the ~120 bytes of two inline dimension lists. A view makes a new one.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Layout(std::sync::Arc<Parts>);

#[derive(Clone, PartialEq, Eq, Hash)]
struct Parts {
    shape: Dims,
    strides: Dims,
    offset: usize,
    /// The product of `shape` (asked for on every op and in the scheduler's loops).
    len: usize,
    /// Exactly `Layout::contiguous(shape)` (what an element-wise op's output is).
    row_major: bool,
}

/// Row-major strides of `shape`, inline.
fn contiguous_dims(shape: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Whether `strides` are exactly `contiguous_dims(shape)` (without building them).
fn is_row_major(shape: &[usize], strides: &[usize]) -> bool {
    if shape.len() != strides.len() {
        return false;
    }
    let mut expected = 1;
    for (&size, &stride) in shape.iter().zip(strides).rev() {
        if stride != expected {
            return false;
        }
        expected *= size;
    }
    true
}

/// The shape two operands broadcast to (numpy rules: aligned from the right, each pair of
/// sizes equal or one of them 1), or `None` when they are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| -> usize {
        // Dimension i of the n-dim result, counted from the left; missing dims are 1.
        let pad = n - s.len();
        if i < pad {
            1
        } else {
            s[i - pad]
        }
    };
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Merges adjacent dimensions that are contiguous in every operand (`strides[k][d] ==
/// strides[k][d+1] · shape[d+1]` for all k) and drops size-1 dimensions, in place. Returns
/// the merged shape (at least one dimension); an operand contiguous in all of `shape` ends
/// with one dimension of stride 1.
pub fn merge_dims(shape: &[usize], strides: &mut [Vec<usize>]) -> Vec<usize> {
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::with_capacity(shape.len()); strides.len()];
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        let mergeable = match out_shape.last() {
            Some(_) => strides.iter().zip(&out_strides).all(|(s, o)| {
                let prev = *o.last().expect("one stride per kept dim");
                prev == s[d] * shape[d]
            }),
            None => false,
        };
        if mergeable {
            *out_shape.last_mut().expect("checked") *= shape[d];
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                *o.last_mut().expect("checked") = s[d];
            }
        } else {
            out_shape.push(shape[d]);
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                o.push(s[d]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for o in out_strides.iter_mut() {
            o.push(1);
        }
    }
    for (s, o) in strides.iter_mut().zip(out_strides) {
        *s = o;
    }
    out_shape
}

/// `merge_dims` of one operand, inline: `shape` read through `strides` with the dimensions
/// contiguous in it merged and size-1 dimensions dropped (at least one dimension remains).
pub(crate) fn merge_dims_one(shape: &[usize], strides: &[usize]) -> (Dims, Dims) {
    let (mut out_shape, mut out_strides) = (Dims::new(), Dims::new());
    for (&size, &stride) in shape.iter().zip(strides) {
        if size == 1 {
            continue;
        }
        match (out_shape.last_mut(), out_strides.last_mut()) {
            (Some(s), Some(t)) if *t == stride * size => {
                *s *= size;
                *t = stride;
            }
            _ => {
                out_shape.push(size);
                out_strides.push(stride);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        out_strides.push(1);
    }
    (out_shape, out_strides)
}

/// Whether `shape` read through `strides` is row-major and dense (strides of size-1
/// dimensions do not matter).
pub(crate) fn is_contiguous(shape: &[usize], strides: &[usize]) -> bool {
    let mut expected = 1;
    for (&size, &stride) in shape.iter().zip(strides).rev() {
        if size != 1 && stride != expected {
            return false;
        }
        expected *= size;
    }
    true
}

type Cache<K> = std::cell::RefCell<rustc_hash::FxHashMap<K, Layout>>;

/// The layout `cache` holds for `key`, else the one `make()` returns with its owned key,
/// kept there (the cache starts over past `LAYOUTS_CACHED`; during thread teardown, made
/// and not kept).
fn cached<K, Q>(
    cache: &'static std::thread::LocalKey<Cache<K>>,
    key: &Q,
    make: impl FnOnce() -> (K, Layout),
) -> Layout
where
    K: std::borrow::Borrow<Q> + Eq + std::hash::Hash,
    Q: Eq + std::hash::Hash + ?Sized,
{
    match cache.try_with(|c| c.borrow().get(key).cloned()) {
        Ok(Some(l)) => l,
        Ok(None) => {
            let (k, l) = make();
            cache.with(|c| {
                let mut c = c.borrow_mut();
                if c.len() >= LAYOUTS_CACHED {
                    c.clear();
                }
                c.insert(k, l.clone());
            });
            l
        }
        Err(_) => make().1,
    }
}

impl Layout {
    /// The layout of (shape, strides, offset): one this thread made before where it has one
    /// (see `ROW_MAJOR` and `VIEWS`).
    fn new(shape: Dims, strides: Dims, offset: usize) -> Layout {
        if offset == 0 && is_row_major(&shape, &strides) {
            return Layout::contiguous(&shape);
        }
        let key = (shape, strides, offset);
        cached(&VIEWS, &key, || {
            let l = Layout(std::sync::Arc::new(Parts {
                len: key.0.iter().product(),
                shape: key.0.clone(),
                strides: key.1.clone(),
                offset,
                row_major: false,
            }));
            (key.clone(), l)
        })
    }

    /// A row-major layout of `shape` from element 0: one this thread made before for the
    /// same shape where it has one (see `ROW_MAJOR`).
    pub fn contiguous(shape: &[usize]) -> Layout {
        cached(&ROW_MAJOR, shape, || {
            let l = Layout(std::sync::Arc::new(Parts {
                shape: Dims::from_slice(shape),
                strides: contiguous_dims(shape),
                offset: 0,
                len: shape.iter().product(),
                row_major: true,
            }));
            (Dims::from_slice(shape), l)
        })
    }

    /// `Layout::contiguous(self.shape())`: this layout itself, borrowed, when it is that
    /// already (an element-wise op's output usually is its input's layout).
    pub(crate) fn row_major(&self) -> std::borrow::Cow<'_, Layout> {
        match self.0.row_major {
            true => std::borrow::Cow::Borrowed(self),
            false => std::borrow::Cow::Owned(Layout::contiguous(self.shape())),
        }
    }

    /// Whether `other` is this layout (the same value, not only an equal one).
    pub(crate) fn same(&self, other: &Layout) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether `other` has this layout's shape (at once when it is this layout).
    pub(crate) fn same_shape(&self, other: &Layout) -> bool {
        self.same(other) || self.shape() == other.shape()
    }

    /// (ndim) sizes.
    pub fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    /// (ndim) element strides; 0 along broadcast dimensions.
    pub fn strides(&self) -> &[usize] {
        &self.0.strides
    }

    /// Element offset of the view's first element in its buffer.
    pub fn offset(&self) -> usize {
        self.0.offset
    }

    pub fn ndim(&self) -> usize {
        self.0.shape.len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.0.len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the elements are row-major and dense (strides of size-1 dimensions do not
    /// matter), from `offset` on.
    pub fn is_contiguous(&self) -> bool {
        self.0.row_major || is_contiguous(self.shape(), self.strides())
    }

    /// Whether the elements are row-major and start at element 0 of the buffer (what the
    /// vec4 kernels and the other kernel families read).
    pub fn is_dense(&self) -> bool {
        self.offset() == 0 && self.is_contiguous()
    }

    /// One past the largest element index the view touches (0 when empty).
    pub fn span(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        self.offset()
            + self
                .shape()
                .iter()
                .zip(self.strides())
                .map(|(&s, &t)| (s - 1) * t)
                .sum::<usize>()
            + 1
    }

    fn check_dim(&self, dim: usize) -> Result<(), String> {
        if dim < self.ndim() {
            Ok(())
        } else {
            Err(format!(
                "dimension {dim} does not exist (the tensor has {}); use 0..{}",
                self.ndim(),
                self.ndim()
            ))
        }
    }

    /// Dimensions `a` and `b` swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Layout, String> {
        self.check_dim(a)?;
        self.check_dim(b)?;
        let (mut shape, mut strides) = (self.0.shape.clone(), self.0.strides.clone());
        shape.swap(a, b);
        strides.swap(a, b);
        Ok(Layout::new(shape, strides, self.offset()))
    }

    /// Dimension `d` of the result is dimension `order[d]` of this layout.
    pub fn permute(&self, order: &[usize]) -> Result<Layout, String> {
        let mut seen = vec![false; self.ndim()];
        let valid = order.len() == self.ndim()
            && order
                .iter()
                .all(|&d| d < self.ndim() && !std::mem::replace(&mut seen[d], true));
        if !valid {
            return Err(format!(
                "{order:?} is not a permutation of 0..{}; name every dimension once",
                self.ndim()
            ));
        }
        Ok(Layout::new(
            order.iter().map(|&d| self.shape()[d]).collect(),
            order.iter().map(|&d| self.strides()[d]).collect(),
            self.offset(),
        ))
    }

    /// Elements `start..start + len` of dimension `dim`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout, String> {
        self.check_dim(dim)?;
        let size = self.shape()[dim];
        let inside = matches!(start.checked_add(len), Some(end) if end <= size);
        if !inside {
            return Err(format!(
                "range {start}..{} is outside dimension {dim} of size {size}",
                start.saturating_add(len)
            ));
        }
        let mut shape = self.0.shape.clone();
        shape[dim] = len;
        let mut offset = self.offset();
        if len > 0 {
            offset += start * self.strides()[dim];
        }
        Ok(Layout::new(shape, self.0.strides.clone(), offset))
    }

    /// This layout repeated to `shape` (numpy broadcasting: new dimensions on the left,
    /// size-1 dimensions stretched with stride 0).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Layout, String> {
        let strides = self.broadcast_strides(shape).ok_or_else(|| {
            format!(
                "cannot broadcast to {shape:?}: aligned from the right, each size must equal \
                 the target's or be 1"
            )
        })?;
        Ok(Layout::new(Dims::from_slice(shape), strides, self.offset()))
    }

    /// This layout's strides seen from `shape` it broadcasts to: 0 along new and stretched
    /// dimensions. `None` when it does not broadcast to `shape`.
    pub(crate) fn broadcast_strides(&self, shape: &[usize]) -> Option<Dims> {
        if shape.len() < self.ndim() {
            return None;
        }
        let pad = shape.len() - self.ndim();
        let mut strides: Dims = smallvec::smallvec![0; shape.len()];
        for d in 0..self.ndim() {
            let (from, to) = (self.shape()[d], shape[pad + d]);
            strides[pad + d] = match (from, to) {
                _ if from == to => self.strides()[d],
                (1, _) => 0,
                _ => return None,
            };
        }
        Some(strides)
    }

    /// The same elements in row-major order as `shape`, without moving them: `None` when the
    /// element counts differ (the caller reports it) or when no strides can express it (the
    /// caller copies). Any layout whose runs of dimensions being merged or split are each
    /// contiguous within themselves qualifies, not only a contiguous one: `(B, T, 1, H, D)`,
    /// a narrowed slot of a fused QKV, is the view `(B, T, H, D)` with the same strides.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        let len = shape.iter().product::<usize>();
        if len != self.len() {
            return None;
        }
        if len == 0 || self.is_contiguous() {
            return Some(Layout::new(
                Dims::from_slice(shape),
                contiguous_dims(shape),
                self.offset(),
            ));
        }
        let strides = reshape_strides(self.shape(), self.strides(), shape)?;
        Some(Layout::new(Dims::from_slice(shape), strides, self.offset()))
    }

    /// The buffer index of every element in row-major order (the CPU reference's gather).
    pub fn indices(&self) -> Vec<usize> {
        let n = self.len();
        let mut out = Vec::with_capacity(n);
        let mut coord = vec![0usize; self.ndim()];
        for _ in 0..n {
            out.push(
                self.offset()
                    + coord
                        .iter()
                        .zip(self.strides())
                        .map(|(c, s)| c * s)
                        .sum::<usize>(),
            );
            for d in (0..self.ndim()).rev() {
                coord[d] += 1;
                if coord[d] < self.shape()[d] {
                    break;
                }
                coord[d] = 0;
            }
        }
        out
    }
}

impl std::fmt::Debug for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layout")
            .field("shape", &self.0.shape)
            .field("strides", &self.0.strides)
            .field("offset", &self.0.offset)
            .finish()
    }
}

/// Strides giving the elements of (`shape`, `strides`) in row-major order as `to` (both with
/// the same, non-zero element count), or `None`. The old dimensions are cut into chunks
/// that are contiguous within themselves (each dimension's stride is the next one's times
/// its size; size-1 dimensions never cut); every chunk must be covered exactly by
/// consecutive new dimensions, which then step through it row-major.
fn reshape_strides(shape: &[usize], strides: &[usize], to: &[usize]) -> Option<Dims> {
    let mut out: Dims = smallvec::smallvec![0; to.len()];
    // New dimensions are assigned from the right.
    let mut view_d = to.len();
    let mut chunk_stride = *strides.last()?;
    let (mut chunk_len, mut view_len) = (1usize, 1usize);
    for d in (0..shape.len()).rev() {
        chunk_len *= shape[d];
        let chunk_ends =
            d == 0 || (shape[d - 1] != 1 && strides[d - 1] != chunk_len * chunk_stride);
        if !chunk_ends {
            continue;
        }
        while view_d > 0 && (view_len < chunk_len || to[view_d - 1] == 1) {
            view_d -= 1;
            out[view_d] = view_len * chunk_stride;
            view_len *= to[view_d];
        }
        if view_len != chunk_len {
            return None;
        }
        if d > 0 {
            chunk_stride = strides[d - 1];
            chunk_len = 1;
            view_len = 1;
        }
    }
    (view_d == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `is_row_major` agrees with comparing against `contiguous_dims`, size-1 dimensions and
    /// zero strides included.
    #[test]
    fn row_major_check_matches_the_built_strides() {
        let cases: [(&[usize], &[usize]); 8] = [
            (&[], &[]),
            (&[5], &[1]),
            (&[5], &[2]),
            (&[2, 3, 4], &[12, 4, 1]),
            (&[2, 3, 4], &[12, 1, 3]),
            (&[2, 1, 4], &[4, 4, 1]),
            (&[2, 1, 4], &[4, 1, 1]),
            (&[3, 4], &[0, 1]),
        ];
        for (shape, strides) in cases {
            assert_eq!(
                is_row_major(shape, strides),
                strides == contiguous_dims(shape).as_slice(),
                "{shape:?} {strides:?}"
            );
        }
        assert!(!is_row_major(&[2, 3], &[3]));
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[2, 3], &[3]), Some(vec![2, 3]));
        assert_eq!(broadcast_shapes(&[4, 1, 5], &[3, 1]), Some(vec![4, 3, 5]));
        assert_eq!(broadcast_shapes(&[], &[2]), Some(vec![2]));
        assert_eq!(broadcast_shapes(&[0, 1], &[1, 3]), Some(vec![0, 3]));
        assert_eq!(broadcast_shapes(&[2, 3], &[3, 2]), None);
        let l = Layout::contiguous(&[3, 1]);
        assert_eq!(
            l.broadcast_strides(&[2, 3, 4]).unwrap().to_vec(),
            vec![0, 1, 0]
        );
        assert_eq!(l.broadcast_strides(&[2, 4]), None);
    }

    #[test]
    fn reshape_keeps_views_where_strides_allow() {
        // One slot of a fused (B, T, 3, H, D) QKV: (B, T, H, D) and (B·T, H·D) are views.
        let (b, t, h, d) = (2, 5, 3, 4);
        let qkv = Layout::contiguous(&[b, t, 3, h, d]);
        let k = qkv.narrow(2, 1, 1).unwrap();
        let v = k.reshape(&[b, t, h, d]).unwrap();
        assert_eq!(v.strides(), &[t * 3 * h * d, 3 * h * d, d, 1]);
        assert_eq!(v.offset(), h * d);
        assert_eq!(v.indices(), k.indices(), "same elements in the same order");
        let rows = k.reshape(&[b * t, h * d]).unwrap();
        assert_eq!(rows.strides(), &[3 * h * d, 1]);
        assert_eq!(rows.indices(), k.indices());
        // Splitting a merged run again, and a trailing unit dimension.
        let split = rows.reshape(&[b, t, h, d, 1]).unwrap();
        assert_eq!(split.indices(), k.indices());
        // Heads merged across the slot gap are not one run: copying is the only way.
        assert!(k.reshape(&[b, t * h * d]).is_none());
        // A transpose reshapes only along its own runs.
        let tr = Layout::contiguous(&[2, 3, 4]).transpose(0, 2).unwrap(); // (4, 3, 2)
        assert!(tr.reshape(&[6, 4]).is_none());
        assert!(tr.reshape(&[4, 6]).is_none());
        let unit = tr.reshape(&[4, 1, 3, 2]).unwrap();
        assert_eq!(unit.indices(), tr.indices());
        // Broadcast (stride 0) runs split and merge too.
        let bc = Layout::contiguous(&[3, 1]).broadcast_to(&[3, 4]).unwrap();
        let bc2 = bc.reshape(&[3, 2, 2]).unwrap();
        assert_eq!(bc2.indices(), bc.indices());
    }

    #[test]
    fn views_are_metadata() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.strides(), &[12, 4, 1]);
        let t = l.transpose(0, 2).unwrap();
        assert_eq!((t.shape(), t.strides()), (&[4, 3, 2][..], &[1, 4, 12][..]));
        assert!(!t.is_contiguous());
        let n = l.narrow(1, 1, 2).unwrap();
        assert_eq!((n.offset(), n.shape()), (4, &[2, 2, 4][..]));
        assert_eq!(n.indices()[..5], [4, 5, 6, 7, 8]);
        assert!(l.narrow(1, 2, 2).is_err());
        assert!(l.permute(&[0, 0, 1]).is_err());
        assert_eq!(l.permute(&[2, 0, 1]).unwrap().shape(), &[4, 2, 3]);
        assert!(l.reshape(&[6, 4]).is_some());
        assert!(t.reshape(&[6, 4]).is_none());
        assert_eq!(l.span(), 24);
        assert_eq!(t.indices()[..3], [0, 12, 4]);
    }

    #[test]
    fn merging_keeps_only_real_strides() {
        // Contiguous: one dimension.
        let mut s = vec![vec![12, 4, 1]];
        assert_eq!(merge_dims(&[2, 3, 4], &mut s), vec![24]);
        assert_eq!(s, vec![vec![1]]);
        // A transposed operand next to a contiguous one keeps two dimensions.
        let mut s = vec![vec![1, 3], vec![2, 1]];
        assert_eq!(merge_dims(&[3, 2], &mut s), vec![3, 2]);
        // A broadcast row: the stride-0 dimension stays separate; size-1 dims vanish.
        let mut s = vec![vec![0, 5, 1], vec![5, 5, 1]];
        assert_eq!(merge_dims(&[4, 1, 5], &mut s), vec![4, 5]);
        assert_eq!(s, vec![vec![0, 1], vec![5, 1]]);
        let mut s = vec![vec![0]];
        assert_eq!(merge_dims(&[1], &mut s), vec![1]);
    }

    #[test]
    fn merging_one_operand_agrees_with_merging_many() {
        let cases: [(&[usize], &[usize]); 6] = [
            (&[2, 3, 4], &[12, 4, 1]),
            (&[3, 2], &[1, 3]),
            (&[4, 1, 5], &[0, 5, 1]),
            (&[64, 256], &[0, 1]),
            (&[2, 3, 4], &[24, 4, 1]),
            (&[1], &[0]),
        ];
        for (shape, strides) in cases {
            let mut many = vec![strides.to_vec()];
            let merged = merge_dims(shape, &mut many);
            let (one, one_strides) = merge_dims_one(shape, strides);
            assert_eq!(
                (one.to_vec(), one_strides.to_vec()),
                (merged, many.remove(0))
            );
        }
    }
}
