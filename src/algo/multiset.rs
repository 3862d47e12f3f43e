//! Multiset operations and sorted-list intersection (issue 15; seed 002
//! moderngpu "Multisets", seed 003 GTWJ and SvS).
//!
//! Every function takes lists sorted ascending (duplicates allowed) and
//! returns a list sorted ascending. Semantics are those of `std::set_*` /
//! moderngpu: a value with m copies in `a` and n copies in `b` appears
//!
//! | op | copies |
//! | --- | --- |
//! | [`MultisetOp::IntersectAll`] | min(m, n) |
//! | [`MultisetOp::ExceptAll`] | max(m − n, 0) |
//! | [`MultisetOp::UnionAll`] | max(m, n) |
//! | [`MultisetOp::SymmetricDifference`] | \|m − n\| |
//!
//! [`sorted_intersect`] (the CPU twin in [`crate::algo::sorted_intersect`],
//! beside its GPU launcher) is the min(m, n) rule too (so it equals
//! `multiset_op(IntersectAll, ..)`), chosen over a distinct result so that
//! chaining it ([`intersect_k`]) stays associative and agrees with
//! `set_intersect_all` and INTERSECT ALL.
//!
//! The functions are generic over `T: Ord + Clone`: the SQL functions use
//! i64 / u64 for integers and `String` for strings (compared as strings, i.e.
//! by UTF-8 bytes), so results are sorted in the element type's own order.

use std::cmp::Ordering;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::PushKernelArg;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, ListArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::{cast_with_options, CastOptions};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, UInt64Type};
use datafusion::error::{DataFusionError, Result};

use crate::algo::list_pack;
use crate::algo::segmented::{
    self, count_then_fill, exclusive_scan, launch_err, DeviceListPair, DeviceSide, ListKey, RowItems, SegmentedResult,
    SideForm, SideParts,
};
use crate::algo::sorted_intersect::sorted_intersect;
use crate::gpu::{DeviceBuffer, Gpu, PinnedLoan, TransferStats};
use crate::keys::ListColumn;
pub use crate::keys::{inline_bytes, inline_key, INLINE_STRING_BYTES};

/// A multiset operation on two sorted lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MultisetOp {
    IntersectAll,
    ExceptAll,
    UnionAll,
    SymmetricDifference,
}

impl MultisetOp {
    pub const ALL: [MultisetOp; 4] =
        [MultisetOp::IntersectAll, MultisetOp::ExceptAll, MultisetOp::UnionAll, MultisetOp::SymmetricDifference];

    /// The SQL function computing this operation.
    pub fn sql_name(self) -> &'static str {
        match self {
            MultisetOp::IntersectAll => "set_intersect_all",
            MultisetOp::ExceptAll => "set_except_all",
            MultisetOp::UnionAll => "set_union_all",
            MultisetOp::SymmetricDifference => "set_symmetric_difference",
        }
    }

    /// Whether an element of `a` without a key-rank partner in `b` is kept.
    fn keeps_a_only(self) -> bool {
        !matches!(self, MultisetOp::IntersectAll)
    }

    /// Whether an element of `b` without a key-rank partner in `a` is kept.
    fn keeps_b_only(self) -> bool {
        matches!(self, MultisetOp::UnionAll | MultisetOp::SymmetricDifference)
    }

    /// Whether a matched pair (the r-th copy of x in both lists) gives one output.
    fn keeps_pair(self) -> bool {
        matches!(self, MultisetOp::IntersectAll | MultisetOp::UnionAll)
    }

    /// The number of copies kept of a value with `m` copies in `a` and `n` in `b`.
    pub fn copies(self, m: usize, n: usize) -> usize {
        match self {
            MultisetOp::IntersectAll => m.min(n),
            MultisetOp::ExceptAll => m.saturating_sub(n),
            MultisetOp::UnionAll => m.max(n),
            MultisetOp::SymmetricDifference => m.abs_diff(n),
        }
    }
}

/// `op` on two ascending lists, as one merge.
///
/// The merge pairs the r-th copy of a value in `a` with the r-th copy in `b`
/// (moderngpu's key-rank match): min(m, n) pairs, then |m − n| copies left on
/// the longer side that meet a larger value (or the end) of the other list.
/// Each op keeps pairs and/or unpaired copies, which yields exactly the
/// counts in the module table.
pub fn multiset_op<T: Ord + Clone>(op: MultisetOp, a: &[T], b: &[T]) -> Vec<T> {
    let mut out = Vec::with_capacity(match op {
        MultisetOp::IntersectAll => a.len().min(b.len()),
        MultisetOp::ExceptAll => a.len(),
        MultisetOp::UnionAll | MultisetOp::SymmetricDifference => a.len() + b.len(),
    });
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => {
                if op.keeps_a_only() {
                    out.push(a[i].clone());
                }
                i += 1;
            }
            Ordering::Greater => {
                if op.keeps_b_only() {
                    out.push(b[j].clone());
                }
                j += 1;
            }
            Ordering::Equal => {
                if op.keeps_pair() {
                    out.push(a[i].clone());
                }
                i += 1;
                j += 1;
            }
        }
    }
    if op.keeps_a_only() {
        out.extend_from_slice(&a[i..]);
    }
    if op.keeps_b_only() {
        out.extend_from_slice(&b[j..]);
    }
    out
}

/// Intersection of k ascending lists by SvS (seed 003): the shortest list is
/// the candidate set, intersected with each next-longer list in turn
/// ([`sorted_intersect`], which gallops when the sizes differ a lot); stops
/// as soon as the candidates run out. No lists give an empty result.
pub fn intersect_k<T: Ord + Clone, L: AsRef<[T]>>(lists: &[L]) -> Vec<T> {
    let mut order: Vec<&[T]> = lists.iter().map(|l| l.as_ref()).collect();
    order.sort_by_key(|l| l.len());
    let Some((first, rest)) = order.split_first() else { return Vec::new() };
    let mut candidates = first.to_vec();
    for l in rest {
        if candidates.is_empty() {
            break;
        }
        candidates = sorted_intersect(&candidates, l);
    }
    candidates
}

/// The first position where `v` is not ascending: Some(i) with v[i] > v[i + 1].
pub fn first_descent<T: Ord>(v: &[T]) -> Option<usize> {
    v.windows(2).position(|w| w[0] > w[1])
}

// ------------------------------------------------------------------------
// List columns: the per-row CPU twin and the segmented GPU kernels
// (kernels/multiset.cu, on kernels/segmented.cu's plumbing), both from Arrow
// list arrays to an Arrow list array.

/// What a two-list function computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListOp {
    /// `set_intersect_all` and friends: any order, sorted per row.
    Multiset(MultisetOp),
    /// `sorted_intersect`: ascending lists, verified (an unsorted row is an error).
    SortedIntersect,
}

impl ListOp {
    /// The SQL function computing this operation.
    pub fn name(self) -> &'static str {
        match self {
            ListOp::Multiset(op) => op.sql_name(),
            ListOp::SortedIntersect => "sorted_intersect",
        }
    }

    /// Every operation, in a fixed order (tests, self-check, fuzz).
    pub const ALL: [ListOp; 5] = [
        ListOp::Multiset(MultisetOp::IntersectAll),
        ListOp::Multiset(MultisetOp::ExceptAll),
        ListOp::Multiset(MultisetOp::UnionAll),
        ListOp::Multiset(MultisetOp::SymmetricDifference),
        ListOp::SortedIntersect,
    ];
}

/// The error of `sorted_intersect` for an unsorted row (the CPU and GPU paths
/// give the same text): `v[k] > v[k + 1]`.
pub fn unsorted_error<T: Debug>(func: &str, which: &str, row: usize, v: &[T], k: usize) -> DataFusionError {
    DataFusionError::Execution(format!(
        "{func}: the {which} argument's list in row {row} of the batch is not sorted ascending \
         ({:?} comes before {:?}); sort it with array_sort or use set_intersect_all",
        v[k],
        v[k + 1]
    ))
}

/// A list argument's rows as keys ([`ListColumn`] read with its elements
/// cast to the key type: `ListColumn::new(array, &T::data_type())`).
trait KeyRows {
    /// Row `i`'s non-NULL elements into `out` (cleared first).
    fn row<T: ListKey>(&self, i: usize, out: &mut Vec<T>);
}

impl KeyRows for ListColumn {
    fn row<T: ListKey>(&self, i: usize, out: &mut Vec<T>) {
        out.clear();
        let Some(values) = &self.values else { return };
        let (s, e) = self.ranges[i];
        let v = T::values(values);
        match values.nulls().filter(|n| n.null_count() > 0) {
            None => out.extend_from_slice(&v[s..e]),
            Some(nb) => out.extend((s..e).filter(|&j| nb.is_valid(j)).map(|j| v[j])),
        }
    }
}

/// Rows whose lists are both non-NULL (the result's validity).
fn both_valid(a: &ListColumn, b: &ListColumn, rows: usize) -> Option<NullBuffer> {
    if a.values.is_none() || b.values.is_none() {
        return Some(NullBuffer::new_null(rows));
    }
    NullBuffer::union(a.nulls.as_ref(), b.nulls.as_ref())
}

fn check_lengths(a: &ArrayRef, b: &ArrayRef) -> Result<()> {
    if a.len() != b.len() {
        return Err(DataFusionError::Internal(format!(
            "list function: argument lengths differ ({} and {})",
            a.len(),
            b.len()
        )));
    }
    Ok(())
}

fn offsets_i32(offsets: Vec<usize>) -> Result<Vec<i32>> {
    if offsets.last().is_some_and(|&t| t > i32::MAX as usize) {
        return Err(DataFusionError::Execution(
            "list function: the result batch holds more than 2^31 - 1 elements".into(),
        ));
    }
    Ok(offsets.into_iter().map(|o| o as i32).collect())
}

/// CPU twin of [`list_op_gpu`]: `op` row by row on two list columns of
/// integers (List / LargeList / FixedSizeList of any integer type, or
/// `DataType::Null`), values read as `T`. NULL elements are ignored, a NULL
/// list gives a NULL row; `set_*` sort each row's lists first,
/// `sorted_intersect` fails on the first row (in row order, first argument
/// before second) with a list that is not ascending. Result: List of `T`.
pub fn list_op_cpu<T: ListKey>(op: ListOp, a: &ArrayRef, b: &ArrayRef) -> Result<ArrayRef> {
    check_lengths(a, b)?;
    let rows = a.len();
    let (sa, sb) = (ListColumn::new(a, &T::data_type())?, ListColumn::new(b, &T::data_type())?);
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0usize);
    let mut values: Vec<T> = Vec::new();
    let (mut x, mut y) = (Vec::<T>::new(), Vec::<T>::new());
    for i in 0..rows {
        if sa.is_valid(i) && sb.is_valid(i) {
            sa.row(i, &mut x);
            sb.row(i, &mut y);
            match op {
                ListOp::Multiset(m) => {
                    x.sort_unstable();
                    y.sort_unstable();
                    values.extend(multiset_op(m, &x, &y));
                }
                ListOp::SortedIntersect => {
                    if let Some(k) = first_descent(&x) {
                        return Err(unsorted_error(op.name(), "first", i, &x, k));
                    }
                    if let Some(k) = first_descent(&y) {
                        return Err(unsorted_error(op.name(), "second", i, &y, k));
                    }
                    values.extend(sorted_intersect(&x, &y));
                }
            }
        }
        offsets.push(values.len());
    }
    T::list(offsets_i32(offsets)?, values, both_valid(&sa, &sb, rows))
}

/// String list arguments as lists of ranks, for the device path, which
/// compares fixed-width keys: every distinct string of both arguments gets
/// its position in UTF-8 byte order (a hash map numbers them, one sort
/// orders the distinct ones), so rank order is string order and
/// the integer rules on ranks give the string rules' answer;
/// [`StringRanks::strings`] maps a result back. NULL elements are dropped
/// (every rule ignores them); NULL lists stay NULL. The CPU twin is the
/// per-row string path of the list functions (`udf::multiset`).
///
/// Where every string of the batch is at most [`INLINE_STRING_BYTES`] bytes
/// (codes, tags, words, numbers as text), no string is looked up: each one's
/// number is the string itself ([`inline_key`]: its bytes from the top, then
/// its length), which orders as the bytes do, and the result decodes from it.
pub struct StringRanks {
    /// List<UInt64> of ranks, the first argument's rows.
    pub a: ArrayRef,
    /// The second argument's rows.
    pub b: ArrayRef,
    decode: RankDecode,
}

/// How a rank maps back to its string.
enum RankDecode {
    /// The distinct strings, ascending (LargeUtf8): rank r is `sorted[r]`.
    Sorted(ArrayRef),
    /// The rank is the string's [`inline_key`].
    Inline,
}

/// A string array of any of Arrow's three layouts, read without a downcast per element.
enum Strings<'a> {
    Utf8(&'a datafusion::arrow::array::StringArray),
    Large(&'a datafusion::arrow::array::LargeStringArray),
    View(&'a datafusion::arrow::array::StringViewArray),
}

impl<'a> Strings<'a> {
    /// `values` is Utf8, LargeUtf8 or Utf8View.
    fn of(values: &'a ArrayRef) -> Self {
        match values.data_type() {
            DataType::Utf8 => Self::Utf8(values.as_string::<i32>()),
            DataType::LargeUtf8 => Self::Large(values.as_string::<i64>()),
            _ => Self::View(values.as_string_view()),
        }
    }

    /// String j's [`inline_key`] (at most [`INLINE_STRING_BYTES`] bytes), read with one load.
    fn inline_key(&self, j: usize) -> u64 {
        match self {
            Self::Utf8(s) => {
                let o = s.value_offsets();
                crate::keys::inline_key_in(s.value_data(), o[j] as usize, o[j + 1] as usize)
            }
            Self::Large(s) => {
                let o = s.value_offsets();
                crate::keys::inline_key_in(s.value_data(), o[j] as usize, o[j + 1] as usize)
            }
            Self::View(s) => crate::keys::inline_key_of_view(s.views()[j]),
        }
    }

    fn get(&self, j: usize) -> Option<&'a str> {
        match self {
            Self::Utf8(s) => s.is_valid(j).then(|| s.value(j)),
            Self::Large(s) => s.is_valid(j).then(|| s.value(j)),
            Self::View(s) => s.is_valid(j).then(|| s.value(j)),
        }
    }
}

impl StringRanks {
    /// Rank two list columns of strings (List / LargeList / FixedSizeList of
    /// Utf8, LargeUtf8, Utf8View or a dictionary of them; not
    /// `DataType::Null`). One hash lookup per element (DataFusion's hash map)
    /// numbers the distinct strings in order of appearance; one sort of the
    /// distinct strings turns the numbers into ranks.
    pub fn new(a: &ArrayRef, b: &ArrayRef) -> Result<Self> {
        use datafusion::arrow::array::LargeStringArray;
        check_lengths(a, b)?;
        let parts = |x: &ArrayRef| -> Result<(ArrayRef, Vec<(usize, usize)>)> {
            let (values, ranges) = crate::keys::list_parts(x)?.ok_or_else(|| {
                DataFusionError::Internal("string ranks: a NULL-typed argument has no strings".into())
            })?;
            let values = match values.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => values,
                _ => cast_with_options(&values, &DataType::LargeUtf8, &CastOptions::default())?,
            };
            Ok((values, ranges))
        };
        let ((va, ra), (vb, rb)) = (parts(a)?, parts(b)?);
        if list_pack::strings_fit_inline(a, b)? {
            let side = |values: &ArrayRef, ranges: &[(usize, usize)], nulls| {
                let strings = Strings::of(values);
                let (mut keys, mut offsets) = (Vec::new(), Vec::with_capacity(ranges.len() + 1));
                offsets.push(0usize);
                for &(start, end) in ranges {
                    keys.extend((start..end).filter(|&j| values.is_valid(j)).map(|j| strings.inline_key(j)));
                    offsets.push(keys.len());
                }
                u64::list(offsets_i32(offsets)?, keys, nulls)
            };
            let (la, lb) = (side(&va, &ra, a.logical_nulls())?, side(&vb, &rb, b.logical_nulls())?);
            return Ok(Self { a: la, b: lb, decode: RankDecode::Inline });
        }
        let mut ids: datafusion::common::HashMap<&str, u32> = Default::default();
        let mut distinct: Vec<&str> = Vec::new();
        // Each side's numbers (one per non-NULL element) and row offsets.
        let [side_a, side_b] = [(&va, &ra), (&vb, &rb)].map(|(values, ranges)| {
            let strings = Strings::of(values);
            let (mut numbers, mut offsets) = (Vec::new(), Vec::with_capacity(ranges.len() + 1));
            offsets.push(0usize);
            for &(start, end) in ranges.iter() {
                for v in (start..end).filter_map(|j| strings.get(j)) {
                    let next = distinct.len() as u32;
                    let id = *ids.entry(v).or_insert(next);
                    if id == next {
                        distinct.push(v);
                    }
                    numbers.push(id);
                }
                offsets.push(numbers.len());
            }
            (numbers, offsets)
        });
        let mut order: Vec<u32> = (0..distinct.len() as u32).collect();
        order.sort_unstable_by_key(|&i| distinct[i as usize]);
        let mut rank = vec![0u64; distinct.len()];
        for (r, &id) in order.iter().enumerate() {
            rank[id as usize] = r as u64;
        }
        let sorted: ArrayRef =
            Arc::new(LargeStringArray::from_iter_values(order.iter().map(|&i| distinct[i as usize])));
        let list = |(numbers, offsets): (Vec<u32>, Vec<usize>), nulls| {
            u64::list(offsets_i32(offsets)?, numbers.into_iter().map(|id| rank[id as usize]).collect(), nulls)
        };
        Ok(Self {
            a: list(side_a, a.logical_nulls())?,
            b: list(side_b, b.logical_nulls())?,
            decode: RankDecode::Sorted(sorted),
        })
    }

    /// A List<UInt64> of ranks (the integer rules' answer on `a` and `b`) as
    /// the List<Utf8> of the strings they stand for.
    pub fn strings(&self, ranks: &ArrayRef) -> Result<ArrayRef> {
        use datafusion::arrow::compute::{cast, take};
        let l = ranks.as_list::<i32>();
        let values: ArrayRef = match &self.decode {
            RankDecode::Sorted(sorted) => cast(&take(sorted, l.values(), None)?, &DataType::Utf8)?,
            RankDecode::Inline => return Self::inline_strings(ranks),
        };
        let field = Arc::new(Field::new_list_field(DataType::Utf8, true));
        Ok(Arc::new(ListArray::try_new(field, l.offsets().clone(), values, l.nulls().cloned())?))
    }

    /// A List<UInt64> of [`inline_key`]s as the List<Utf8> of their strings.
    pub fn inline_strings(keys: &ArrayRef) -> Result<ArrayRef> {
        let l = keys.as_list::<i32>();
        let keys = l.values().as_primitive::<UInt64Type>().values();
        let mut out = datafusion::arrow::array::StringBuilder::with_capacity(keys.len(), keys.len() * 4);
        let mut buf = [0u8; 8];
        for &k in keys.iter() {
            let s = std::str::from_utf8(inline_bytes(k, &mut buf))
                .map_err(|e| DataFusionError::Internal(format!("string ranks: an inline key decodes to {e}")))?;
            out.append_value(s);
        }
        let field = Arc::new(Field::new_list_field(DataType::Utf8, true));
        Ok(Arc::new(ListArray::try_new(field, l.offsets().clone(), Arc::new(out.finish()), l.nulls().cloned())?))
    }
}

/// Element count of a list column's rows (NULL lists count their ranges
/// too): what the UDF's cost rule weighs.
pub fn list_elements(array: &ArrayRef) -> Result<usize> {
    Ok(match crate::keys::list_parts(array)? {
        None => 0,
        Some((_, ranges)) => ranges.iter().map(|(s, e)| e - s).sum(),
    })
}

/// kernels/multiset.cu, with the rules' op codes and the Balanced Path tile
/// as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "multiset",
    source: include_str!("../../kernels/multiset.cu"),
    defines: multiset_defines,
};

/// Inputs (A and B elements of one row's merge) per Balanced Path tile; one
/// thread walks one tile (`MS_BP_VT`). Each tile costs one Balanced Path
/// search (a Merge Path search and three binary searches over its row, about
/// 4 log2(row) probes: ~40 for rows of 1,000), so a tile walks about as many
/// slots as its search probes at the typical row lengths; longer
/// tiles would leave rows of 10-100 elements to one or two threads.
/// moderngpu's keys tuning is VT = 11 per thread, but its threads search in
/// shared memory after a per-CTA search; ours search the row in global memory.
pub const BALANCED_PATH_VT: u32 = 16;

fn multiset_defines() -> Vec<(String, u64)> {
    let mut defines: Vec<(String, u64)> = [
        ("INTERSECT_ALL", MultisetOp::IntersectAll),
        ("EXCEPT_ALL", MultisetOp::ExceptAll),
        ("UNION_ALL", MultisetOp::UnionAll),
        ("SYMMETRIC_DIFFERENCE", MultisetOp::SymmetricDifference),
    ]
    .into_iter()
    .map(|(name, op)| (format!("MS_{name}"), kernel_code(op) as u64))
    .collect();
    defines.push(("MS_BP_VT".into(), BALANCED_PATH_VT as u64));
    defines
}

/// The rule's number in kernels/multiset.cu (`op` of `ms_bp_walk`, passed as `MS_*`).
fn kernel_code(op: MultisetOp) -> i32 {
    match op {
        MultisetOp::IntersectAll => 0,
        MultisetOp::ExceptAll => 1,
        MultisetOp::UnionAll => 2,
        MultisetOp::SymmetricDifference => 3,
    }
}

/// `op` on two list columns of integers as segmented kernels: the same
/// inputs and result as [`list_op_cpu`] (including `sorted_intersect`'s
/// error for the first unsorted row). The host packs the batch
/// ([`PreparedLists::new`]: [`crate::algo::list_pack`]), then, per side
/// ([`segmented::DeviceSide`]): one DMA of the keys (32-bit offsets from the
/// batch's smallest image, widened on the device; in a raw batch the values'
/// own bytes, made into images on the device) and offsets, a segment id per
/// element. For `set_*`: each unsorted side's rows sorted on the device
/// ([`segmented::DeviceSide::sort_segments`]: one block per row in shared
/// memory, or a radix sort of (segment, key) when a row is longer), then each row's merge by Balanced Path
/// tiles ([`balanced_path_segmented`], kernels/multiset.cu). For
/// `sorted_intersect`: GTWJ sequence skipping per row
/// ([`crate::algo::sorted_intersect::gtwj_segmented`],
/// kernels/sorted_intersect.cu). Both count, scan, then write the result into
/// the host's bound of its length; its offsets, then its values, come back.
pub fn list_op_gpu<T: ListKey>(
    gpu: &Gpu,
    op: ListOp,
    a: &ArrayRef,
    b: &ArrayRef,
    stats: &mut TransferStats,
) -> Result<ArrayRef> {
    PreparedLists::new::<T>(gpu, op, a, b)?.run::<T>(gpu, stats)
}

/// The host's part of [`list_op_gpu`], done before the device is taken so
/// that partitions prepare their batches in parallel while one of them holds
/// the device: the batch read and packed into a pinned buffer lent by the
/// device's pool ([`crate::algo::list_pack`]).
pub struct PreparedLists {
    op: ListOp,
    plan: list_pack::Plan,
    /// None: no valid row keeps an element (the result is empty and NULL rows).
    loan: Option<PinnedLoan>,
    /// `sorted_intersect` over an unsorted row: the inputs, for the CPU twin's error.
    unsorted: Option<(ArrayRef, ArrayRef)>,
    /// The batch's parts already queued for the device ([`PreparedLists::upload_ahead`]).
    ahead: Option<BatchParts>,
}

/// A packed batch's parts on the device (or on their way there).
struct BatchParts {
    valid: DeviceBuffer<u8>,
    sides: [SideParts; 2],
    tiles: Option<DeviceBuffer<u32>>,
}

impl BatchParts {
    /// Queue every part's copy from `loan` on `stream`.
    fn upload(
        gpu: &Gpu,
        stream: &Arc<cudarc::driver::CudaStream>,
        plan: &list_pack::Plan,
        loan: &mut PinnedLoan,
        stats: &mut TransferStats,
    ) -> Result<Self> {
        let (l, rows) = (&plan.layout, plan.rows);
        let valid = gpu.upload_loaned_on::<u8>(stream, loan, 0, rows, stats)?;
        let mut side = |s: usize| {
            let form = match l.raw {
                Some(raw) => SideForm::Raw(raw[s]),
                None => SideForm::Packed { wide: plan.wide },
            };
            SideParts::upload(gpu, stream, loan, (l.offsets[s], l.keys[s]), rows, plan.sides[s].n(), form, stats)
        };
        let sides = [side(0)?, side(1)?];
        let tiles = match l.tiles {
            Some(at) => Some(gpu.upload_loaned_on::<u32>(stream, loan, at, rows + 1, stats)?),
            None => None,
        };
        Ok(Self { valid, sides, tiles })
    }
}

impl PreparedLists {
    pub fn new<T: ListKey>(gpu: &Gpu, op: ListOp, a: &ArrayRef, b: &ArrayRef) -> Result<Self> {
        check_lengths(a, b)?;
        let (tiles, bound) = match op {
            ListOp::Multiset(rule) => (
                Some(BALANCED_PATH_VT),
                match rule {
                    MultisetOp::IntersectAll => list_pack::RowBound::Min,
                    MultisetOp::ExceptAll => list_pack::RowBound::First,
                    MultisetOp::UnionAll | MultisetOp::SymmetricDifference => list_pack::RowBound::Sum,
                },
            ),
            ListOp::SortedIntersect => (None, list_pack::RowBound::Min),
        };
        let (plan, loan) =
            list_pack::pack::<T, LoanBytes>(a, b, tiles, bound, |bytes| Ok(LoanBytes(gpu.pinned_loan(bytes)?)))?;
        let unsorted = (op == ListOp::SortedIntersect && !(plan.sides[0].ascending && plan.sides[1].ascending))
            .then(|| (a.clone(), b.clone()));
        Ok(Self { op, plan, loan: loan.map(|l| l.0), unsorted, ahead: None })
    }

    /// Queue the batch's copies to the device now, on the device's stream for
    /// copies ahead of a lease ([`Gpu::ahead_stream`]), so that they overlap
    /// the kernels of the batch that holds the device; [`PreparedLists::run`]
    /// then only waits for them. Device memory is charged now: callers do
    /// this only under the default budget, and a batch whose copies do not
    /// fit (or fail) is copied under its lease as before.
    pub fn upload_ahead(&mut self, gpu: &Gpu, stats: &mut TransferStats) {
        let (Some(loan), None) = (self.loan.as_mut(), &self.unsorted) else { return };
        if gpu.budget().used() + self.plan.layout.bytes > gpu.budget().limit() / 8 {
            return;
        }
        let Ok(stream) = gpu.ahead_stream() else { return };
        match BatchParts::upload(gpu, &stream, &self.plan, loan, stats) {
            Ok(parts) => self.ahead = Some(parts),
            // Parts copied before the failure may still be reading the loan, which `run`
            // copies again on the main stream (whose event alone the loan then waits for).
            Err(_) => {
                let _ = stream.synchronize();
            }
        }
    }

    /// `sorted_intersect` over a row that is not ascending ([`PreparedLists::run`]
    /// then answers with the CPU twin's error, which string callers word themselves).
    pub fn is_unsorted(&self) -> bool {
        self.unsorted.is_some()
    }

    /// The device's part of [`list_op_gpu`] (`T` as given to [`PreparedLists::new`]).
    pub fn run<T: ListKey>(self, gpu: &Gpu, stats: &mut TransferStats) -> Result<ArrayRef> {
        let Self { op, plan, loan, unsorted, ahead } = self;
        if let Some((a, b)) = unsorted {
            // The CPU twin finds the first unsorted row and words the error.
            return list_op_cpu::<T>(op, &a, &b);
        }
        let rows = plan.rows;
        let Some(mut loan) = loan else {
            return T::list(vec![0; rows + 1], Vec::new(), plan.nulls);
        };
        let frame = (plan.base, plan.max);
        let parts = match ahead {
            Some(parts) => parts,
            None => BatchParts::upload(gpu, gpu.stream(), &plan, &mut loan, stats)?,
        };
        let BatchParts { valid, sides: [pa, pb], tiles: tile_offsets } = parts;
        let mut da = DeviceSide::from_parts(gpu, pa, plan.sides[0].n(), rows, plan.base, T::FLIP)?;
        let mut db = DeviceSide::from_parts(gpu, pb, plan.sides[1].n(), rows, plan.base, T::FLIP)?;
        let started = Instant::now();
        let tiles = match (op, tile_offsets) {
            (ListOp::Multiset(_), Some(offsets)) => {
                if !plan.sides[0].ascending {
                    da.sort_segments(gpu, rows, frame, plan.sides[0].longest())?;
                }
                if !plan.sides[1].ascending {
                    db.sort_segments(gpu, rows, frame, plan.sides[1].longest())?;
                }
                let n = plan.tiles.as_ref().and_then(|t| t.last()).map_or(0, |&t| t as usize);
                Some(RowItems::from_offsets(gpu, offsets, rows, n)?)
            }
            _ => None,
        };
        let pair = DeviceListPair { a: da, b: db, valid, rows };
        let result = match (op, tiles) {
            (ListOp::Multiset(rule), Some(tiles)) => {
                balanced_path_segmented::<T>(gpu, rule, &pair, &tiles, plan.bound)?
            }
            _ => crate::algo::sorted_intersect::gtwj_segmented::<T>(gpu, &pair, plan.bound, stats)?,
        };
        gpu.synchronize()?;
        stats.kernel += started.elapsed();
        let (offsets, values) = result.download(gpu, rows, stats)?;
        drop(loan);
        T::list(offsets.into_iter().map(|o| o as i32).collect(), values, plan.nulls)
    }
}

/// A pinned loan as the packer's byte buffer.
struct LoanBytes(PinnedLoan);

impl AsMut<[u8]> for LoanBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        // A fresh loan has no copy in flight, so this does not wait; its length is at least the size asked for.
        self.0.as_mut_slice().unwrap_or(&mut [])
    }
}

/// The multiset rule `rule` on every valid row of two device sides whose
/// rows are sorted, by segmented Balanced Path (kernels/multiset.cu): each
/// row's merge is cut into `tiles` of [`BALANCED_PATH_VT`] inputs (+-1) that
/// never cross a row (laid out by the host, [`crate::algo::list_pack`]), one
/// thread per tile; a tile's start is where its cross-diagonal meets the
/// row's Balanced Path, so every key-rank pair lies in one tile; each thread
/// runs the serial set op over its tile, first to count, then (after a scan)
/// to write, into a result of `bound` entries.
fn balanced_path_segmented<T: ListKey>(
    gpu: &Gpu,
    rule: MultisetOp,
    pair: &DeviceListPair,
    tiles: &RowItems,
    bound: usize,
) -> Result<SegmentedResult<T>> {
    let (stream, rows) = (gpu.stream(), pair.rows);
    let nt32 = tiles.n as u32;
    let parts = gpu.alloc::<u64>(tiles.n)?;
    let f = gpu.function(&KERNEL, "ms_bp_partition")?;
    let mut l = stream.launch_builder(&f);
    pair.push_sides(&mut l);
    l.arg(&tiles.offsets.slice).arg(&tiles.rows_of.slice).arg(&nt32).arg(&parts.slice);
    // SAFETY: keys hold their side's n entries and offsets rows + 1; tiles.offsets rows + 1, tiles.rows_of and parts tiles.n.
    unsafe { l.launch(gpu.grid_stride(tiles.n, 32)) }.map_err(launch_err("ms_bp_partition"))?;
    let code = kernel_code(rule);
    let f = gpu.function(&KERNEL, "ms_bp_walk")?;
    count_then_fill(gpu, tiles, rows, bound, |pass| {
        let (null, flip) = (0u64, T::FLIP);
        let mut l = stream.launch_builder(&f);
        l.arg(&code);
        pair.push_sides(&mut l);
        l.arg(&tiles.offsets.slice).arg(&tiles.rows_of.slice).arg(&parts.slice).arg(&nt32);
        pass.push(&mut l, &null, &flip);
        // SAFETY: as for ms_bp_partition; counts hold tiles.n entries, starts tiles.n + 1 and values (T, 8 bytes) `bound`, at least every tile's outputs.
        unsafe { l.launch(gpu.grid_stride(tiles.n, 32)) }.map_err(launch_err("ms_bp_walk"))?;
        Ok(())
    })
}

/// Sorted lists resident on the device, for repeated k-way intersections
/// (a posting-list index; the `set_intersect_agg` path uploads one per call).
pub struct DeviceLists<T> {
    lists: Vec<DeviceBuffer<u64>>,
    lens: Vec<usize>,
    _t: std::marker::PhantomData<T>,
}

impl<T: ListKey> DeviceLists<T> {
    /// Upload ascending lists (not checked) as their u64 key images.
    pub fn upload<L: AsRef<[T]>>(gpu: &Gpu, lists: &[L], stats: &mut TransferStats) -> Result<Self> {
        let mut out = Vec::with_capacity(lists.len());
        for l in lists {
            let l = l.as_ref();
            let raw = gpu.upload(l, stats)?;
            let keys = gpu.alloc::<u64>(l.len())?;
            if !l.is_empty() {
                let f = gpu.function(&segmented::KERNEL, "ms_xor")?;
                let (n64, flip) = (l.len() as u64, T::FLIP);
                // SAFETY: raw (8-byte T) and keys hold len entries.
                unsafe {
                    gpu.stream()
                        .launch_builder(&f)
                        .arg(&raw.slice)
                        .arg(&n64)
                        .arg(&flip)
                        .arg(&keys.slice)
                        .launch(gpu.grid_stride(l.len(), 32))
                }
                .map_err(launch_err("ms_xor"))?;
            }
            out.push(keys);
        }
        Ok(Self { lens: lists.iter().map(|l| l.as_ref().len()).collect(), lists: out, _t: std::marker::PhantomData })
    }

    pub fn len(&self) -> usize {
        self.lists.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }

    /// The min(m, n) intersection of the lists `terms` (indices), by SvS on
    /// the device: the shortest list is the candidate set; for each next
    /// longer list one thread per candidate binary-searches it (its rank in
    /// its run of equal candidates against the copies found), and the
    /// survivors are compacted by a scan. Equals [`intersect_k`].
    pub fn intersect(&self, gpu: &Gpu, terms: &[usize], stats: &mut TransferStats) -> Result<Vec<T>> {
        let mut order: Vec<usize> = terms.to_vec();
        if let Some(&bad) = order.iter().find(|&&t| t >= self.lists.len()) {
            return Err(DataFusionError::Internal(format!("k-way intersection: list {bad} of {}", self.lists.len())));
        }
        order.sort_by_key(|&t| self.lens[t]);
        let Some((&first, rest)) = order.split_first() else { return Ok(Vec::new()) };
        let started = Instant::now();
        let stream = gpu.stream();
        let mut n = self.lens[first];
        let mut owned: Option<DeviceBuffer<u64>> = None;
        for &t in rest {
            if n == 0 {
                break;
            }
            let cand = owned.as_ref().unwrap_or(&self.lists[first]);
            let flag = gpu.alloc::<u32>(n)?;
            let f = gpu.function(&KERNEL, "ms_kway_flags")?;
            let (nc, nl) = (n as u64, self.lens[t] as u64);
            // SAFETY: cand holds n keys, the list nl, flag n entries.
            unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&cand.slice)
                    .arg(&nc)
                    .arg(&self.lists[t].slice)
                    .arg(&nl)
                    .arg(&flag.slice)
                    .launch(gpu.grid_stride(n, 32))
            }
            .map_err(launch_err("ms_kway_flags"))?;
            let excl = exclusive_scan(gpu, &flag, n)?;
            let kept = gpu.read_one(&excl, n, stats)? as usize;
            let next = gpu.alloc::<u64>(kept)?;
            let f = gpu.function(&KERNEL, "ms_compact")?;
            // SAFETY: cand, flag and excl cover n entries; next holds the kept count.
            unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&cand.slice)
                    .arg(&nc)
                    .arg(&flag.slice)
                    .arg(&excl.slice)
                    .arg(&next.slice)
                    .launch(gpu.grid_stride(n, 32))
            }
            .map_err(launch_err("ms_compact"))?;
            owned = Some(next);
            n = kept;
        }
        if n == 0 {
            stats.kernel += started.elapsed();
            return Ok(Vec::new());
        }
        let cand = owned.as_ref().unwrap_or(&self.lists[first]);
        let out = gpu.alloc::<T>(n)?;
        let f = gpu.function(&segmented::KERNEL, "ms_xor")?;
        let (n64, flip) = (n as u64, T::FLIP);
        // SAFETY: cand and out (8-byte T) hold n entries.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&cand.slice)
                .arg(&n64)
                .arg(&flip)
                .arg(&out.slice)
                .launch(gpu.grid_stride(n, 32))
        }
        .map_err(launch_err("ms_xor"))?;
        gpu.synchronize()?;
        stats.kernel += started.elapsed();
        gpu.download(&out, n, stats)
    }
}

/// GPU twin of [`intersect_k`] for integer lists (ascending, duplicates
/// allowed): uploads the lists and runs [`DeviceLists::intersect`].
pub fn intersect_k_gpu<T: ListKey, L: AsRef<[T]>>(gpu: &Gpu, lists: &[L], stats: &mut TransferStats) -> Result<Vec<T>> {
    let dl = DeviceLists::upload(gpu, lists, stats)?;
    dl.intersect(gpu, &(0..lists.len()).collect::<Vec<_>>(), stats)
}

/// Random list columns for the self-check and tests: `rows` rows of up to
/// `max_len` values in [-domain, domain) (every 11th row NULL on a side,
/// every 7th empty, some NULL elements when `null_elements`).
pub fn random_list_column(
    rng: &mut impl rand::Rng,
    rows: usize,
    max_len: usize,
    domain: i64,
    null_elements: bool,
) -> ArrayRef {
    let lists: Vec<Option<Vec<Option<i64>>>> = (0..rows)
        .map(|i| {
            if rng.random_range(0..11) == 0 {
                return None;
            }
            let len = if i % 7 == 3 { 0 } else { rng.random_range(0..=max_len) };
            Some(
                (0..len)
                    .map(|_| {
                        if null_elements && rng.random_range(0..20) == 0 {
                            None
                        } else {
                            Some(rng.random_range(-domain..domain))
                        }
                    })
                    .collect(),
            )
        })
        .collect();
    Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(lists))
}

/// [`random_list_column`] with each integer written as a string
/// (`domain` values, so rows share strings; byte order differs from
/// numeric order: "-1" < "10" < "9").
pub fn random_string_list_column(
    rng: &mut impl rand::Rng,
    rows: usize,
    max_len: usize,
    domain: i64,
    null_elements: bool,
) -> ArrayRef {
    use datafusion::arrow::array::{ListBuilder, StringBuilder};
    let ints = random_list_column(rng, rows, max_len, domain, null_elements);
    let ints = ints.as_list::<i32>();
    let mut b = ListBuilder::new(StringBuilder::new());
    for i in 0..ints.len() {
        if ints.is_null(i) {
            b.append_null();
            continue;
        }
        let row = ints.value(i);
        let row = row.as_primitive::<Int64Type>();
        for j in 0..row.len() {
            b.values().append_option(row.is_valid(j).then(|| row.value(j).to_string()));
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

/// The moderngpu worked example (seed 002, "Multisets"): one row each.
pub fn moderngpu_example() -> (ArrayRef, ArrayRef) {
    let a: Vec<i64> = vec![1, 1, 2, 3, 3, 3, 5, 6, 6, 6, 6, 7, 7, 8, 8, 9];
    let b: Vec<i64> = vec![1, 2, 2, 3, 3, 3, 3, 6, 6, 6, 6, 8];
    let col = |v: Vec<i64>| -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>([Some(v.into_iter().map(Some))]))
    };
    (col(a), col(b))
}

/// Doctor self-check: every list operation on random columns (duplicates,
/// NULL lists and elements, empty lists, a slice, unsigned keys, wide and
/// narrow domains) and the k-way intersection, against the CPU twins.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let stats = &mut TransferStats::default();
    let mut checked = 0;
    let mut columns = vec![moderngpu_example()];
    // Rows of up to 3,000 elements span many Balanced Path tiles and GTWJ sequences.
    for &(rows, max_len, domain, nulls) in &[
        (1usize, 0usize, 1i64, false),
        (300, 40, 5, true),
        (2000, 200, 1000, false),
        (500, 30, i64::MAX / 2, false),
        (40, 3000, 2000, true),
    ] {
        let a = random_list_column(&mut rng, rows + 3, max_len, domain, nulls);
        let b = random_list_column(&mut rng, rows + 3, max_len, domain, nulls);
        columns.push((a.slice(2, rows), b.slice(1, rows)));
    }
    for (a, b) in &columns {
        for op in ListOp::ALL {
            let (a, b) =
                if op == ListOp::SortedIntersect { (sort_rows(a)?, sort_rows(b)?) } else { (a.clone(), b.clone()) };
            let want = list_op_cpu::<i64>(op, &a, &b)?;
            let got = list_op_gpu::<i64>(gpu, op, &a, &b, stats)?;
            if &got != &want {
                return Err(DataFusionError::Execution(format!(
                    "multiset self-check failed: {} on {} rows (i64)",
                    op.name(),
                    a.len()
                )));
            }
            // Unsigned keys: the same rows shifted into u64.
            let (ua, ub) = (to_unsigned(&a)?, to_unsigned(&b)?);
            if list_op_gpu::<u64>(gpu, op, &ua, &ub, stats)? != list_op_cpu::<u64>(op, &ua, &ub)? {
                return Err(DataFusionError::Execution(format!(
                    "multiset self-check failed: {} on {} rows (u64)",
                    op.name(),
                    a.len()
                )));
            }
            checked += 2;
        }
    }
    for case in 0..20 {
        let k = 1 + case % 6;
        let lists: Vec<Vec<i64>> = (0..k)
            .map(|_| {
                let n = rng.random_range(0..5000);
                let mut v: Vec<i64> = (0..n).map(|_| rng.random_range(-300..300)).collect();
                v.sort_unstable();
                v
            })
            .collect();
        if intersect_k_gpu(gpu, &lists, stats)? != intersect_k(&lists) {
            return Err(DataFusionError::Execution(format!(
                "multiset self-check failed: k-way intersection of {k} lists"
            )));
        }
        checked += 1;
    }
    Ok(format!("{checked} list operations and k-way intersections match the CPU twins"))
}

/// Each row of an Int64 list column sorted ascending (NULL elements first).
pub fn sort_rows(a: &ArrayRef) -> Result<ArrayRef> {
    let l = a.as_list::<i32>();
    let rows: Vec<Option<Vec<Option<i64>>>> = (0..l.len())
        .map(|i| {
            l.is_valid(i).then(|| {
                let mut v: Vec<Option<i64>> = l.value(i).as_primitive::<Int64Type>().iter().collect();
                v.sort_unstable();
                v
            })
        })
        .collect();
    Ok(Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(rows)))
}

/// An Int64 list column mapped to UInt64 by adding 2^63 (order kept).
pub(crate) fn to_unsigned(a: &ArrayRef) -> Result<ArrayRef> {
    let l = a.as_list::<i32>();
    let rows: Vec<Option<Vec<Option<u64>>>> = (0..l.len())
        .map(|i| {
            l.is_valid(i).then(|| {
                l.value(i).as_primitive::<Int64Type>().iter().map(|x| x.map(|x| (x as u64) ^ (1 << 63))).collect()
            })
        })
        .collect();
    Ok(Arc::new(ListArray::from_iter_primitive::<UInt64Type, _, _>(rows)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::algo::sorted_intersect::{
        sequence_index, sorted_intersect_sequences, sorted_intersect_with, IntersectMethod,
    };

    /// Counting reference: the module table applied to BTreeMap counts.
    fn reference(op: MultisetOp, a: &[i64], b: &[i64]) -> Vec<i64> {
        let mut counts: BTreeMap<i64, (usize, usize)> = BTreeMap::new();
        for x in a {
            counts.entry(*x).or_default().0 += 1;
        }
        for x in b {
            counts.entry(*x).or_default().1 += 1;
        }
        counts.into_iter().flat_map(|(x, (m, n))| std::iter::repeat_n(x, op.copies(m, n))).collect()
    }

    fn random_sorted(rng: &mut rand::rngs::StdRng, len: usize, domain: i64) -> Vec<i64> {
        let mut v: Vec<i64> = (0..len).map(|_| rng.random_range(-domain..domain)).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn moderngpu_worked_example() {
        let a = [1, 1, 2, 3, 3, 3, 5, 6, 6, 6, 6, 7, 7, 8, 8, 9];
        let b = [1, 2, 2, 3, 3, 3, 3, 6, 6, 6, 6, 8];
        // By hand from the counts (value: m in a, n in b): 1:2,1 2:1,2 3:3,4
        // 5:1,0 6:4,4 7:2,0 8:2,1 9:1,0.
        let expected: [(MultisetOp, &[i64]); 4] = [
            (MultisetOp::IntersectAll, &[1, 2, 3, 3, 3, 6, 6, 6, 6, 8]),
            // 3 has m − n = 3 − 4 < 0 copies: no 3 (moderngpu's "1 5 7 7 8 9").
            (MultisetOp::ExceptAll, &[1, 5, 7, 7, 8, 9]),
            (MultisetOp::UnionAll, &[1, 1, 2, 2, 3, 3, 3, 3, 5, 6, 6, 6, 6, 7, 7, 8, 8, 9]),
            (MultisetOp::SymmetricDifference, &[1, 2, 3, 5, 7, 7, 8, 9]),
        ];
        for (op, want) in expected {
            assert_eq!(multiset_op(op, &a, &b), want, "{op:?}");
            assert_eq!(reference(op, &a, &b), want, "{op:?} reference");
        }
        assert_eq!(sorted_intersect(&a, &b), expected[0].1);
        assert_eq!(sorted_intersect_sequences(&a, &b, 2), expected[0].1);
    }

    #[test]
    fn ops_match_counting_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        for case in 0..2000 {
            // Small domains give many duplicates; some lists are empty.
            let domain = [1, 2, 5, 20, 1000][case % 5];
            let (na, nb) = (rng.random_range(0..40), rng.random_range(0..40));
            let (a, b) = (random_sorted(&mut rng, na, domain), random_sorted(&mut rng, nb, domain));
            for op in MultisetOp::ALL {
                assert_eq!(multiset_op(op, &a, &b), reference(op, &a, &b), "{op:?} {a:?} {b:?}");
            }
        }
        assert!(multiset_op::<i64>(MultisetOp::UnionAll, &[], &[]).is_empty());
        assert_eq!(multiset_op(MultisetOp::ExceptAll, &[1, 1], &[]), vec![1, 1]);
        assert_eq!(multiset_op(MultisetOp::SymmetricDifference, &[], &[2, 2]), vec![2, 2]);
    }

    #[test]
    fn sorted_intersect_methods_agree() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for case in 0..2000 {
            let domain = [1, 3, 30, 1000, 100_000][case % 5];
            // Very different sizes exercise galloping under Auto.
            let na = rng.random_range(0..20);
            let nb = if case % 2 == 0 { rng.random_range(0..20) } else { rng.random_range(0..2000) };
            let (a, b) = (random_sorted(&mut rng, na, domain), random_sorted(&mut rng, nb, domain));
            let want = reference(MultisetOp::IntersectAll, &a, &b);
            for method in [IntersectMethod::Auto, IntersectMethod::Merge, IntersectMethod::Gallop] {
                assert_eq!(sorted_intersect_with(method, &a, &b), want, "{method:?} {a:?} {b:?}");
                assert_eq!(sorted_intersect_with(method, &b, &a), want, "{method:?} swapped");
            }
            for val in [1, 2, 7, 100, 5000] {
                assert_eq!(sorted_intersect_sequences(&a, &b, val), want, "GTWJ val {val}");
            }
            let ua: Vec<u64> = a.iter().map(|x| (x + domain) as u64).collect();
            let ub: Vec<u64> = b.iter().map(|x| (x + domain) as u64).collect();
            let uwant: Vec<u64> = want.iter().map(|x| (x + domain) as u64).collect();
            assert_eq!(sorted_intersect_sequences(&ua, &ub, 3), uwant);
        }
        assert_eq!(sorted_intersect_sequences(&[1i64, 2], &[2], 0), vec![2], "val 0 acts as 1");
    }

    #[test]
    fn sequence_index_handles_negatives() {
        // floor division: -1 and -100 are in sequence -1, 0..99 in 0.
        assert_eq!(sequence_index(&[-100i64, -1, 0, 99, 100], 100), vec![(-1, 0, 2), (0, 2, 4), (1, 4, 5)]);
    }

    #[test]
    fn intersect_k_matches_pairwise() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for case in 0..500 {
            let k = rng.random_range(0..6);
            let domain = [2, 10, 100][case % 3];
            let lists: Vec<Vec<i64>> = (0..k)
                .map(|_| {
                    let n = rng.random_range(0..60);
                    random_sorted(&mut rng, n, domain)
                })
                .collect();
            let want = match lists.split_first() {
                None => vec![],
                Some((first, rest)) => {
                    rest.iter().fold(first.clone(), |acc, l| reference(MultisetOp::IntersectAll, &acc, l))
                }
            };
            assert_eq!(intersect_k(&lists), want, "{lists:?}");
        }
        let strings = [vec!["a".to_string(), "b".into(), "b".into()], vec!["b".into(), "b".into(), "c".into()]];
        assert_eq!(intersect_k(&strings), vec!["b".to_string(), "b".into()]);
    }

    #[test]
    fn first_descent_finds_unsorted() {
        assert_eq!(first_descent(&[1, 2, 2, 3]), None);
        assert_eq!(first_descent(&[1, 3, 2]), Some(1));
        assert_eq!(first_descent::<i64>(&[]), None);
    }

    /// A column of one row per (a, b) list pair, built from plain vectors.
    fn column(rows: &[Option<Vec<i64>>]) -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(
            rows.iter().map(|r| r.as_ref().map(|v| v.iter().map(|x| Some(*x)))),
        ))
    }

    /// The rows of a result column (None: NULL list).
    fn rows_of(a: &ArrayRef) -> Vec<Option<Vec<i64>>> {
        let l = a.as_list::<i32>();
        (0..l.len()).map(|i| l.is_valid(i).then(|| l.value(i).as_primitive::<Int64Type>().values().to_vec())).collect()
    }

    /// Host mirror of `sf_balanced_path` (kernels/common.cuh): the A index
    /// where cross-diagonal `diag` meets the Balanced Path of a and b, and
    /// whether the diagonal is starred (its B coordinate is diag - A index + star).
    fn balanced_path<T: Ord + Copy>(a: &[T], b: &[T], diag: usize) -> (usize, bool) {
        let (na, nb) = (a.len(), b.len());
        // Merge Path, lower-bound flavour: on ties A's elements come first.
        let (mut lo, mut hi) = (diag.saturating_sub(nb), diag.min(na));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if b[diag - 1 - mid] >= a[mid] {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let (mut ai, bi) = (lo, diag - lo);
        let mut star = false;
        if bi < nb {
            let x = b[bi];
            let a_start = a[..ai].partition_point(|v| *v < x);
            let b_start = b[..bi].partition_point(|v| *v < x);
            let a_run = ai - a_start;
            let x_count = a_run + (bi - b_start);
            let mut b_adv = (x_count >> 1).max(x_count - a_run);
            let b_end = nb.min(b_start + b_adv + 1);
            let b_run = bi + b[bi..b_end].partition_point(|v| *v <= x) - b_start;
            b_adv = b_adv.min(b_run);
            let a_adv = x_count - b_adv;
            star = a_adv == b_adv + 1 && b_adv < b_run;
            ai = a_start + a_adv;
        }
        (ai, star)
    }

    /// Host mirror of `ms_serial_set_op` (kernels/multiset.cu): the slots
    /// from (i, j) until i + j reaches `end`, outputs appended to `out`;
    /// returns where the walk stopped.
    fn serial_set_op<T: Ord + Copy>(
        op: MultisetOp,
        a: &[T],
        b: &[T],
        mut i: usize,
        mut j: usize,
        end: usize,
        out: &mut Vec<T>,
    ) -> (usize, usize) {
        while i + j < end {
            let (a_in, b_in) = (i < a.len(), j < b.len());
            let a_first = a_in && (!b_in || a[i] < b[j]);
            let b_first = b_in && (!a_in || b[j] < a[i]);
            let kept = match op {
                MultisetOp::IntersectAll => (!a_first && !b_first).then(|| a[i]),
                MultisetOp::ExceptAll => a_first.then(|| a[i]),
                MultisetOp::UnionAll => Some(if b_first { b[j] } else { a[i] }),
                MultisetOp::SymmetricDifference => (a_first || b_first).then(|| if a_first { a[i] } else { b[j] }),
            };
            out.extend(kept);
            if !b_first {
                i += 1;
            }
            if !a_first {
                j += 1;
            }
        }
        (i, j)
    }

    /// One row as the device runs it (`ms_bp_partition`, `ms_tile`,
    /// `ms_bp_walk`): tiles of `vt` inputs from their
    /// Balanced Path starts, each walked serially, outputs concatenated.
    /// Asserts the partition's promises: every walk ends exactly at the next
    /// tile's start, and every tile but the last holds vt - 1 to vt + 1 inputs.
    fn balanced_path_row<T: Ord + Copy + Debug>(op: MultisetOp, a: &[T], b: &[T], vt: usize) -> Vec<T> {
        let tiles = (a.len() + b.len()).div_ceil(vt);
        let start = |k: usize| {
            let (ai, star) = balanced_path(a, b, k * vt);
            (ai, k * vt - ai + star as usize)
        };
        let mut out = Vec::new();
        for k in 0..tiles {
            let (a0, b0) = start(k);
            let (a1, b1) = if k + 1 < tiles { start(k + 1) } else { (a.len(), b.len()) };
            if k + 1 < tiles {
                let inputs = a1 + b1 - a0 - b0;
                assert!(
                    inputs + 1 >= vt && inputs <= vt + 1,
                    "tile {k} of {a:?} / {b:?} (vt {vt}) holds {inputs} inputs"
                );
            }
            let stop = serial_set_op(op, a, b, a0, b0, a1 + b1, &mut out);
            assert_eq!(stop, (a1, b1), "tile {k} of {a:?} / {b:?} (vt {vt}) overran its end");
        }
        out
    }

    /// The device's Balanced Path algorithm, mirrored on the host, against
    /// the counting reference: every rule, tile sizes 1 to 20 and the
    /// device's, duplicates (small domains), empty lists, long rows.
    #[test]
    fn balanced_path_tiles_match_counting_reference() {
        let a = [1i64, 1, 2, 3, 3, 3, 5, 6, 6, 6, 6, 7, 7, 8, 8, 9];
        let b = [1i64, 2, 2, 3, 3, 3, 3, 6, 6, 6, 6, 8];
        let vts: Vec<usize> = (1..=20).chain([BALANCED_PATH_VT as usize]).collect();
        for op in MultisetOp::ALL {
            for &vt in &vts {
                assert_eq!(balanced_path_row(op, &a, &b, vt), reference(op, &a, &b), "{op:?} worked example, vt {vt}");
                assert_eq!(balanced_path_row(op, &b, &a, vt), reference(op, &b, &a), "{op:?} swapped, vt {vt}");
            }
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(1415);
        for case in 0..3000 {
            let domain = [1, 2, 3, 8, 50, 1 << 40][case % 6];
            let long = case % 10 == 0;
            let (na, nb) = if long {
                (rng.random_range(0..400), rng.random_range(0..400))
            } else {
                (rng.random_range(0..30), rng.random_range(0..30))
            };
            let (a, b) = (random_sorted(&mut rng, na, domain), random_sorted(&mut rng, nb, domain));
            let vt = vts[case % vts.len()];
            for op in MultisetOp::ALL {
                assert_eq!(balanced_path_row(op, &a, &b, vt), reference(op, &a, &b), "{op:?} {a:?} / {b:?}, vt {vt}");
            }
        }
    }

    /// The moderngpu page's starred diagonal: cutting A = B = 6 6 6 6 after
    /// seven inputs must keep the fourth pair together (the left tile takes 6b3).
    #[test]
    fn balanced_path_stars_a_split_pair() {
        let six = [6i64; 4];
        // Balanced Path order: 6a0 6b0 6a1 6b1 6a2 6b2 6a3 | 6b3: diag 7 is starred.
        assert_eq!(balanced_path(&six, &six, 7), (4, true));
        assert_eq!(balanced_path(&six, &six, 6), (3, false));
        assert_eq!(balanced_path(&six, &six, 8), (4, false));
        assert_eq!(balanced_path(&six, &six, 0), (0, false));
    }

    /// The list twin row by row against the counting reference (NULL
    /// elements dropped, NULL lists NULL), on sliced random columns.
    #[test]
    fn list_op_cpu_matches_counting_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        let a = random_list_column(&mut rng, 503, 30, 6, true).slice(3, 500);
        let b = random_list_column(&mut rng, 500, 30, 6, true);
        let (la, lb) = (a.as_list::<i32>(), b.as_list::<i32>());
        let row = |l: &ListArray, i: usize| -> Option<Vec<i64>> {
            l.is_valid(i).then(|| l.value(i).as_primitive::<Int64Type>().iter().flatten().collect())
        };
        for op in MultisetOp::ALL {
            let got = rows_of(&list_op_cpu::<i64>(ListOp::Multiset(op), &a, &b).unwrap());
            for i in 0..500 {
                let want = match (row(la, i), row(lb, i)) {
                    (Some(x), Some(y)) => Some(reference(op, &x, &y)),
                    _ => None,
                };
                assert_eq!(got[i], want, "{op:?} row {i}");
            }
        }
        let (a, b) = moderngpu_example();
        let got = rows_of(&list_op_cpu::<i64>(ListOp::SortedIntersect, &a, &b).unwrap());
        assert_eq!(got, vec![Some(vec![1, 2, 3, 3, 3, 6, 6, 6, 6, 8])]);
        let bad = column(&[Some(vec![1, 2]), Some(vec![5, 4])]);
        let err = list_op_cpu::<i64>(ListOp::SortedIntersect, &bad, &bad).unwrap_err().to_string();
        assert!(err.contains("first argument's list in row 1") && err.contains("5 comes before 4"), "{err}");
    }

    /// The moderngpu worked example on the device, per rule, against the
    /// counts by hand (see `moderngpu_worked_example`).
    #[test]
    fn gpu_moderngpu_example() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let stats = &mut TransferStats::default();
        let (a, b) = moderngpu_example();
        let expected: [(ListOp, Vec<i64>); 5] = [
            (ListOp::Multiset(MultisetOp::IntersectAll), vec![1, 2, 3, 3, 3, 6, 6, 6, 6, 8]),
            (ListOp::Multiset(MultisetOp::ExceptAll), vec![1, 5, 7, 7, 8, 9]),
            (ListOp::Multiset(MultisetOp::UnionAll), vec![1, 1, 2, 2, 3, 3, 3, 3, 5, 6, 6, 6, 6, 7, 7, 8, 8, 9]),
            (ListOp::Multiset(MultisetOp::SymmetricDifference), vec![1, 2, 3, 5, 7, 7, 8, 9]),
            (ListOp::SortedIntersect, vec![1, 2, 3, 3, 3, 6, 6, 6, 6, 8]),
        ];
        for (op, want) in expected {
            let got = list_op_gpu::<i64>(&gpu, op, &a, &b, stats).unwrap();
            assert_eq!(rows_of(&got), vec![Some(want)], "{op:?}");
        }
    }

    /// GPU vs CPU twin on random columns: duplicates (small domains), NULL
    /// lists, NULL elements, empty lists, slices, already-sorted input, wide
    /// keys (the two-sort path), other list and integer types, unsigned keys.
    #[test]
    fn gpu_list_ops_match_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let stats = &mut TransferStats::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(99);
        let cases = [
            (0usize, 5usize, 3i64, false),
            (1, 1, 1, false),
            (1000, 50, 4, true),
            (5000, 300, 100, false),
            (3000, 20, i64::MAX / 2, true),
            (200_000, 12, 1 << 20, false),
        ];
        for &(rows, max_len, domain, nulls) in &cases {
            let a = random_list_column(&mut rng, rows + 5, max_len, domain, nulls).slice(5, rows);
            let b = random_list_column(&mut rng, rows, max_len, domain, nulls);
            for op in ListOp::ALL {
                let (a, b) = if op == ListOp::SortedIntersect {
                    (sort_rows(&a).unwrap(), sort_rows(&b).unwrap())
                } else {
                    (a.clone(), b.clone())
                };
                let want = list_op_cpu::<i64>(op, &a, &b).unwrap();
                let got = list_op_gpu::<i64>(&gpu, op, &a, &b, stats).unwrap();
                assert!(got == want, "{op:?}: {rows} rows of up to {max_len} in domain {domain}");
                let (ua, ub) = (to_unsigned(&a).unwrap(), to_unsigned(&b).unwrap());
                assert!(
                    list_op_gpu::<u64>(&gpu, op, &ua, &ub, stats).unwrap() == list_op_cpu::<u64>(op, &ua, &ub).unwrap(),
                    "{op:?} u64"
                );
            }
            // Already sorted rows skip the device sort: same results.
            let (sa, sb) = (sort_rows(&a).unwrap(), sort_rows(&b).unwrap());
            let op = ListOp::Multiset(MultisetOp::SymmetricDifference);
            assert!(list_op_gpu::<i64>(&gpu, op, &sa, &sb, stats).unwrap() == list_op_cpu::<i64>(op, &a, &b).unwrap());
        }
        // Int32 LargeList against FixedSizeList(Int16), read as i64.
        use datafusion::arrow::array::{FixedSizeListArray, Int16Array, Int32Array, LargeListArray};
        use datafusion::arrow::datatypes::Int32Type;
        let a: ArrayRef = Arc::new(LargeListArray::from_iter_primitive::<Int32Type, _, _>([
            Some(vec![Some(3), Some(1), Some(3)]),
            None,
            Some(vec![Some(-2)]),
        ]));
        let _ = Int32Array::from(vec![1]);
        let field = Arc::new(Field::new_list_field(DataType::Int16, true));
        let b: ArrayRef =
            Arc::new(FixedSizeListArray::new(field, 2, Arc::new(Int16Array::from(vec![3, 3, 1, 1, -2, 7])), None));
        for op in ListOp::ALL.into_iter().take(4) {
            assert!(
                list_op_gpu::<i64>(&gpu, op, &a, &b, stats).unwrap() == list_op_cpu::<i64>(op, &a, &b).unwrap(),
                "{op:?} mixed types"
            );
        }
        // All-NULL (DataType::Null) side.
        let nulls: ArrayRef = Arc::new(datafusion::arrow::array::NullArray::new(3));
        assert_eq!(list_op_gpu::<i64>(&gpu, ListOp::ALL[2], &a, &nulls, stats).unwrap().null_count(), 3);
        // Raw batches (no NULL element): NULL rows that keep elements, a row longer than the
        // block sort (the integers' range), Int32 and UInt16 values sent in their own bytes.
        use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
        let lens = [3usize, 0, 2500, 4, 7, 1];
        let total: usize = lens.iter().sum();
        let list = |values: ArrayRef, lens: Vec<usize>, valid: Vec<bool>| -> ArrayRef {
            let field = Arc::new(Field::new_list_field(values.data_type().clone(), true));
            Arc::new(ListArray::new(field, OffsetBuffer::from_lengths(lens), values, Some(NullBuffer::from(valid))))
        };
        let vals: ArrayRef = Arc::new(Int32Array::from_iter_values((0..total).map(|i| ((i * 7919) % 97) as i32 - 40)));
        let a = list(vals.clone(), lens.to_vec(), vec![true, true, true, false, true, true]);
        let b = list(vals, lens.iter().rev().copied().collect(), vec![true, false, true, true, true, true]);
        let u16s: ArrayRef =
            Arc::new(datafusion::arrow::array::UInt16Array::from_iter_values((0..total).map(|i| (i % 61) as u16)));
        let (ua, ub) = (
            list(u16s.clone(), lens.to_vec(), vec![true; 6]),
            list(u16s, lens.iter().rev().copied().collect(), vec![true, true, false, true, true, true]),
        );
        for op in ListOp::ALL.into_iter().take(4) {
            let got = list_op_gpu::<i64>(&gpu, op, &a, &b, stats).unwrap();
            assert!(got == list_op_cpu::<i64>(op, &a, &b).unwrap(), "{op:?} raw Int32");
            let got = list_op_gpu::<u64>(&gpu, op, &ua, &ub, stats).unwrap();
            assert!(got == list_op_cpu::<u64>(op, &ua, &ub).unwrap(), "{op:?} raw UInt16");
        }
        // Raw strings (Utf8, LargeUtf8, Utf8View of at most 7 bytes): the device's inline keys
        // give the CPU twin's result over the host's inline keys.
        let words = ["", "a", "b", "zzzzzzz", "\u{e9}", "ab", "a\0", "q"];
        let n_words: Vec<&str> = (0..total).map(|i| words[(i * 31 + i / 7) % words.len()]).collect();
        let keys: ArrayRef = Arc::new(datafusion::arrow::array::UInt64Array::from_iter_values(
            n_words.iter().map(|w| crate::keys::inline_key(w.as_bytes())),
        ));
        let valid_a = vec![true, true, true, false, true, true];
        let valid_b = vec![true, false, true, true, true, true];
        let rev: Vec<usize> = lens.iter().rev().copied().collect();
        let (ka, kb) = (list(keys.clone(), lens.to_vec(), valid_a.clone()), list(keys, rev.clone(), valid_b.clone()));
        let string_values: [ArrayRef; 3] = [
            Arc::new(datafusion::arrow::array::StringArray::from(n_words.clone())),
            Arc::new(datafusion::arrow::array::LargeStringArray::from(n_words.clone())),
            Arc::new(datafusion::arrow::array::StringViewArray::from(n_words.clone())),
        ];
        for values in string_values {
            let (sa, sb) =
                (list(values.clone(), lens.to_vec(), valid_a.clone()), list(values, rev.clone(), valid_b.clone()));
            for op in ListOp::ALL.into_iter().take(4) {
                let got = list_op_gpu::<u64>(&gpu, op, &sa, &sb, stats).unwrap();
                assert!(got == list_op_cpu::<u64>(op, &ka, &kb).unwrap(), "{op:?} raw strings {}", sa.data_type());
            }
        }
    }

    /// Batches whose copies were queued on the ahead stream before the
    /// device was taken (as partitions do), several at once, then run one
    /// after another: each equals the CPU twin, raw and packed batches alike.
    #[test]
    fn gpu_batches_uploaded_ahead_match_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let stats = &mut TransferStats::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        let op = ListOp::Multiset(MultisetOp::IntersectAll);
        let batches: Vec<(ArrayRef, ArrayRef)> = (0..6)
            .map(|i| {
                let null_elements = i % 3 == 2; // the packed path
                let a = random_list_column(&mut rng, 3000, 300, 1 << (4 + i), null_elements);
                let b = random_list_column(&mut rng, 3000, 300, 1 << (4 + i), null_elements);
                (a, b)
            })
            .collect();
        let mut prepared: Vec<PreparedLists> = Vec::new();
        for (a, b) in &batches {
            let mut p = PreparedLists::new::<i64>(&gpu, op, a, b).unwrap();
            p.upload_ahead(&gpu, stats);
            assert!(p.ahead.is_some(), "the copies were queued ahead");
            prepared.push(p);
        }
        for (p, (a, b)) in prepared.into_iter().zip(&batches) {
            let lease = gpu.lease(0);
            let got = p.run::<i64>(&lease, stats).unwrap();
            assert!(got == list_op_cpu::<i64>(op, a, b).unwrap());
        }
    }

    /// A column whose rows have very different lengths (0 to 5,000: one or
    /// many Balanced Path tiles and GTWJ sequences per row, rows of exactly
    /// one tile and one past it), duplicates from a small domain, every
    /// 13th row NULL, some NULL elements; `sorted` gives ascending rows.
    fn uneven_column(rng: &mut rand::rngs::StdRng, rows: usize, domain: i64, sorted: bool) -> ArrayRef {
        let vt = BALANCED_PATH_VT as usize;
        let lengths = [0, 1, 2, vt - 1, vt, vt + 1, 2 * vt + 1, 100, 1000, 5000];
        let lists: Vec<Option<Vec<Option<i64>>>> = (0..rows)
            .map(|i| {
                if i % 13 == 5 {
                    return None;
                }
                let len = lengths[rng.random_range(0..lengths.len())];
                let mut v: Vec<Option<i64>> = (0..len)
                    .map(|_| if rng.random_range(0..50) == 0 { None } else { Some(rng.random_range(-domain..domain)) })
                    .collect();
                if sorted {
                    v.sort_unstable();
                }
                Some(v)
            })
            .collect();
        Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(lists))
    }

    /// GPU vs CPU twin, every rule and sorted_intersect, on rows of very
    /// different lengths (many tiles per row next to empty rows), in dense
    /// domains (long runs of duplicates that tiles must not split) and wide
    /// ones, signed and unsigned keys.
    #[test]
    fn gpu_list_ops_match_cpu_twin_on_uneven_rows() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let stats = &mut TransferStats::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1515);
        for domain in [1i64, 3, 40, 5000, i64::MAX / 2] {
            for op in ListOp::ALL {
                let sorted = op == ListOp::SortedIntersect;
                let a = uneven_column(&mut rng, 300, domain, sorted);
                let b = uneven_column(&mut rng, 300, domain, sorted);
                let want = list_op_cpu::<i64>(op, &a, &b).unwrap();
                let got = list_op_gpu::<i64>(&gpu, op, &a, &b, stats).unwrap();
                assert!(got == want, "{op:?} on uneven rows in domain {domain}");
                let (ua, ub) = (to_unsigned(&a).unwrap(), to_unsigned(&b).unwrap());
                assert!(
                    list_op_gpu::<u64>(&gpu, op, &ua, &ub, stats).unwrap() == list_op_cpu::<u64>(op, &ua, &ub).unwrap(),
                    "{op:?} u64, domain {domain}"
                );
            }
        }
    }

    /// sorted_intersect's error names the same row and argument on both paths.
    #[test]
    fn gpu_sorted_intersect_rejects_unsorted_like_cpu() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let stats = &mut TransferStats::default();
        let op = ListOp::SortedIntersect;
        let a = column(&[Some(vec![1, 2]), Some(vec![1, 2, 2]), None, Some(vec![9, 8]), Some(vec![1])]);
        let b = column(&[Some(vec![2]), Some(vec![5, 4]), Some(vec![3, 1]), Some(vec![1, 0]), Some(vec![1])]);
        for (a, b) in [(&a, &b), (&b, &a), (&a, &a)] {
            let cpu = list_op_cpu::<i64>(op, a, b).unwrap_err().to_string();
            let gpu_err = list_op_gpu::<i64>(&gpu, op, a, b, stats).unwrap_err().to_string();
            assert_eq!(cpu, gpu_err);
        }
        // Row 2 is NULL on one side: its unsorted list is not checked.
        let ok = list_op_gpu::<i64>(&gpu, op, &a.slice(0, 1), &b.slice(0, 1), stats).unwrap();
        assert_eq!(rows_of(&ok), vec![Some(vec![2])]);
    }

    /// k-way intersection on the device against `intersect_k` and against
    /// repeated `sorted_intersect`, including empty lists and no lists.
    #[test]
    fn gpu_intersect_k_matches_repeated_sorted_intersect() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let stats = &mut TransferStats::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        for case in 0..60 {
            let k = case % 8;
            let domain = [3, 50, 10_000, 1 << 40][case % 4];
            let lists: Vec<Vec<i64>> = (0..k)
                .map(|_| {
                    let n = if rng.random_range(0..10) == 0 {
                        0
                    } else {
                        rng.random_range(1..[100, 5000, 200_000][case % 3])
                    };
                    random_sorted(&mut rng, n, domain)
                })
                .collect();
            let repeated = match lists.split_first() {
                None => vec![],
                Some((first, rest)) => rest.iter().fold(first.clone(), |acc, l| sorted_intersect(&acc, l)),
            };
            assert_eq!(intersect_k_gpu(&gpu, &lists, stats).unwrap(), repeated, "case {case}");
            assert_eq!(intersect_k(&lists), repeated);
            let ul: Vec<Vec<u64>> = lists.iter().map(|l| l.iter().map(|x| (*x as u64) ^ (1 << 63)).collect()).collect();
            let uw: Vec<u64> = repeated.iter().map(|x| (*x as u64) ^ (1 << 63)).collect();
            assert_eq!(intersect_k_gpu(&gpu, &ul, stats).unwrap(), uw);
        }
        let msg = self_check(&gpu).unwrap();
        assert!(msg.contains("match"), "{msg}");
    }

    /// sorted_intersect on the device (GTWJ) against the CPU twin: random
    /// ascending rows with duplicates, NULL lists, NULL elements, empty
    /// lists, slices, rows of very different lengths, long rows, wide keys,
    /// signed and unsigned; and the moderngpu worked example.
    #[test]
    fn gpu_gtwj_sorted_intersect_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lock = gpu.lock_blocking();
        let stats = &mut TransferStats::default();
        let op = ListOp::SortedIntersect;
        let (a, b) = moderngpu_example();
        let got = list_op_gpu::<i64>(&gpu, op, &a, &b, stats).unwrap();
        assert!(got == list_op_cpu::<i64>(op, &a, &b).unwrap(), "worked example");
        let mut rng = rand::rngs::StdRng::seed_from_u64(1503);
        let cases = [
            (1usize, 1usize, 1i64, false),
            (2000, 40, 3, true),
            (2000, 300, 1000, true),
            (500, 30, i64::MAX / 2, false),
            (30, 6000, 20_000, true),
            (100_000, 12, 1 << 20, false),
        ];
        for (case, &(rows, max_len, domain, nulls)) in cases.iter().enumerate() {
            let a = sort_rows(&random_list_column(&mut rng, rows + 4, max_len, domain, nulls).slice(4, rows)).unwrap();
            // The other side's rows: as long, or much shorter (then they drive).
            let b_len = if case % 2 == 0 { max_len } else { max_len / 20 + 1 };
            let b = sort_rows(&random_list_column(&mut rng, rows, b_len, domain, nulls)).unwrap();
            for (x, y) in [(&a, &b), (&b, &a)] {
                let want = list_op_cpu::<i64>(op, x, y).unwrap();
                assert!(
                    list_op_gpu::<i64>(&gpu, op, x, y, stats).unwrap() == want,
                    "{rows} rows of up to {max_len} in domain {domain}"
                );
                let (ux, uy) = (to_unsigned(x).unwrap(), to_unsigned(y).unwrap());
                assert!(
                    list_op_gpu::<u64>(&gpu, op, &ux, &uy, stats).unwrap() == list_op_cpu::<u64>(op, &ux, &uy).unwrap(),
                    "u64, domain {domain}"
                );
            }
        }
    }
}
