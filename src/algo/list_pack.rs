//! A batch of two list arguments packed on the host for the segmented list
//! kernels (issue 31: list columns reach the device without per-batch host
//! casts or uploads under the device lock).
//!
//! Each partition packs its own batch on its own thread before it takes the
//! device, straight into a pinned buffer the device's pool lends
//! ([`crate::gpu::PinnedLoan`]), so that under the lock only DMAs and kernels
//! remain, and nothing is read back before the result's offsets:
//! - the elements are read from the list's own Arrow values (Int8-Int64,
//!   UInt8-UInt64: no cast to 64 bits; other types are cast first), and
//!   strings of at most 7 bytes as their inline keys (`keys::inline_key`: the
//!   bytes themselves, which order as the strings do), with no hash lookup;
//! - NULL elements, and the elements of rows whose result is NULL (a NULL list
//!   on either side), are dropped: every rule ignores them;
//! - each element travels as its u64 key image ([`ListKey::image`]) less the
//!   batch's smallest image, in 32 bits, unless the batch's images span 2^32
//!   or more (then as whole images): half the PCIe bytes of the old 64-bit
//!   upload, and no cast;
//! - the host learns, in the same pass, what the device used to read back:
//!   whether every row is ascending (skip the segmented sort; `sorted_intersect`
//!   refuses an unsorted row), the images' range (the sort's bits), the rows'
//!   Balanced Path tiles, and an upper bound of the result's length (the fill
//!   allocates it without reading the count back).
//!
//! A **raw batch** skips the per-element work for the multiset rules (whose
//! device path can sort every row): when neither side has a NULL element and
//! each side's rows follow one another in its values (List, LargeList,
//! FixedSizeList), each side's values are copied in their own Arrow bytes
//! (integers of any width; strings of at most 7 bytes as u32 offsets and
//! data, or Utf8View views) and the device makes the key images
//! ([`RawImages`], kernels/segmented.cu). The elements of NULL result rows
//! travel too, but those rows get no tile. On the host only rows are visited:
//! the H200 trace of 1M rows of Utf8 lists (8.3M elements a batch) measured
//! 96 ms a batch to pack the keys against ~3 ms holding the device, and
//! INT lists 29 ms. The integers' range is read only when a row is longer
//! than the device's block sort (the radix sort's bits); strings then sort
//! on all 64 bits.
//!
//! [`pack`] reads (first pass) and packs (second pass) into any byte buffer:
//! the tests unpack it on the CPU; the device path packs into the loan. The device side is [`crate::algo::multiset::PreparedLists`].

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::{cast_with_options, CastOptions};
use datafusion::arrow::datatypes::{
    DataType, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use datafusion::error::{DataFusionError, Result};

use crate::algo::segmented::{ListKey, RawImages, ROW_SORT_MAX};
use crate::keys::{inline_key_in, inline_key_of_view, INLINE_STRING_BYTES};

/// An upper bound of one row's result length from its two lists' lengths
/// (m, n): the rules' own maxima.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowBound {
    /// min(m, n): INTERSECT ALL, `sorted_intersect`.
    Min,
    /// m: EXCEPT ALL.
    First,
    /// m + n: UNION ALL, symmetric difference.
    Sum,
}

impl RowBound {
    fn of(self, m: usize, n: usize) -> usize {
        match self {
            RowBound::Min => m.min(n),
            RowBound::First => m,
            RowBound::Sum => m + n,
        }
    }
}

/// What one side's first pass found.
#[derive(Debug, Clone)]
pub struct SideFacts {
    /// Row r's kept elements are [offsets[r], offsets[r + 1]) of the side's keys.
    pub offsets: Vec<u32>,
    /// Every valid row ascending (NULL elements skipped).
    pub ascending: bool,
    /// Smallest and largest image (None: no kept element).
    pub range: Option<(u64, u64)>,
}

impl SideFacts {
    /// Kept elements.
    pub fn n(&self) -> usize {
        self.offsets.last().map_or(0, |&o| o as usize)
    }

    /// The longest row's kept elements.
    pub fn longest(&self) -> usize {
        self.offsets.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0)
    }
}

/// Byte positions of the packed parts (each 16-aligned), after one validity
/// byte per row at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Each side's row offsets (rows + 1 u32).
    pub offsets: [usize; 2],
    /// Balanced Path tile offsets (rows + 1 u32), when asked for.
    pub tiles: Option<usize>,
    /// Each side's keys (32-bit offsets or 64-bit images), or in a raw batch its values' own bytes.
    pub keys: [usize; 2],
    /// A raw batch: how each side's values travel (see [`pack`]).
    pub raw: Option<[RawImages; 2]>,
    pub bytes: usize,
}

/// A batch read for packing: everything the device needs to know, and where
/// each part goes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub rows: usize,
    /// The result's NULL rows (a NULL list on either side).
    pub nulls: Option<NullBuffer>,
    pub valid: Vec<u8>,
    pub sides: [SideFacts; 2],
    /// The images' frame over both sides: keys are `base + offset` (32 bits)
    /// unless `wide` (whole 64-bit images).
    pub base: u64,
    pub max: u64,
    pub wide: bool,
    /// Tiles per row (rows + 1 offsets) when packed for Balanced Path.
    pub tiles: Option<Vec<u32>>,
    /// At least the result's total length.
    pub bound: usize,
    pub layout: Layout,
}

impl Plan {
    /// Any valid row with a kept element on either side? (Else the result is all empty or NULL rows.)
    pub fn is_empty(&self) -> bool {
        self.sides[0].n() + self.sides[1].n() == 0
    }
}

/// The two arguments' values and row ranges, the values of a native
/// integer type or cast to `T`'s.
struct Side {
    values: Option<ArrayRef>,
    ranges: Vec<(usize, usize)>,
    nulls: Option<NullBuffer>,
}

impl Side {
    fn read<T: ListKey>(array: &ArrayRef) -> Result<Self> {
        let nulls = array.logical_nulls();
        Ok(match crate::keys::list_parts(array)? {
            None => Self { values: None, ranges: vec![(0, 0); array.len()], nulls },
            Some((values, ranges)) => {
                let native = match values.data_type() {
                    DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => T::FLIP != 0,
                    DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => true,
                    // Strings travel as their inline keys ([`strings_fit_inline`]).
                    DataType::UInt64 | DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => T::FLIP == 0,
                    _ => false,
                };
                // (Strings are checked to fit their inline keys where the keys are made: in
                // plan_sides, or in write_raw's pass over the strings.)
                let values = if native {
                    values
                } else {
                    // Not `safe`: a value the key type cannot hold fails, as the CPU twin's cast does.
                    cast_with_options(&values, &T::data_type(), &CastOptions { safe: false, ..Default::default() })?
                };
                Self { values: Some(values), ranges, nulls }
            }
        })
    }

    fn is_valid(&self, i: usize) -> bool {
        self.values.is_some() && self.nulls.as_ref().is_none_or(|n| n.is_valid(i))
    }

    /// The values from the first row's start to the last row's end (all of a
    /// raw batch's side: its rows follow one another).
    fn span(&self) -> (usize, usize) {
        (self.ranges.first().map_or(0, |r| r.0), self.ranges.last().map_or(0, |r| r.1))
    }
}

/// `$body` with `$img` the key image under `T` of the element at an index
/// of `$values`: integers by their value; strings of at most
/// [`INLINE_STRING_BYTES`] bytes by [`inline_key`] (the caller checked their
/// length: [`strings_fit_inline`]).
macro_rules! with_images {
    ($values:expr, $t:ty, |$img:ident| $body:expr) => {{
        let flip = <$t as ListKey>::FLIP;
        let values: &ArrayRef = $values;
        match values.data_type() {
            DataType::Int8 => {
                let v = values.as_primitive::<Int8Type>().values();
                let $img = |j: usize| (v[j] as i64 as u64) ^ flip;
                $body
            }
            DataType::Int16 => {
                let v = values.as_primitive::<Int16Type>().values();
                let $img = |j: usize| (v[j] as i64 as u64) ^ flip;
                $body
            }
            DataType::Int32 => {
                let v = values.as_primitive::<Int32Type>().values();
                let $img = |j: usize| (v[j] as i64 as u64) ^ flip;
                $body
            }
            DataType::Int64 => {
                let v = values.as_primitive::<Int64Type>().values();
                let $img = |j: usize| (v[j] as u64) ^ flip;
                $body
            }
            DataType::UInt8 => {
                let v = values.as_primitive::<UInt8Type>().values();
                let $img = |j: usize| (v[j] as u64) ^ flip;
                $body
            }
            DataType::UInt16 => {
                let v = values.as_primitive::<UInt16Type>().values();
                let $img = |j: usize| (v[j] as u64) ^ flip;
                $body
            }
            DataType::UInt32 => {
                let v = values.as_primitive::<UInt32Type>().values();
                let $img = |j: usize| (v[j] as u64) ^ flip;
                $body
            }
            DataType::UInt64 => {
                let v = values.as_primitive::<UInt64Type>().values();
                let $img = |j: usize| v[j] ^ flip;
                $body
            }
            DataType::Utf8 => {
                let v = values.as_string::<i32>();
                let (o, data) = (v.value_offsets(), v.value_data());
                let $img = |j: usize| inline_key_in(data, o[j] as usize, o[j + 1] as usize) ^ flip;
                $body
            }
            DataType::LargeUtf8 => {
                let v = values.as_string::<i64>();
                let (o, data) = (v.value_offsets(), v.value_data());
                let $img = |j: usize| inline_key_in(data, o[j] as usize, o[j + 1] as usize) ^ flip;
                $body
            }
            DataType::Utf8View => {
                let views = values.as_string_view().views();
                let $img = |j: usize| inline_key_of_view(views[j]) ^ flip;
                $body
            }
            other => Err(DataFusionError::Internal(format!("list packing: unexpected element type {other}"))),
        }
    }};
}

/// The refusal of a string longer than an inline key holds.
fn long_strings() -> DataFusionError {
    DataFusionError::Internal(format!(
        "list packing: strings of more than {INLINE_STRING_BYTES} bytes have no inline key"
    ))
}

/// Do both list columns hold only strings (Utf8, LargeUtf8, Utf8View) of at
/// most [`INLINE_STRING_BYTES`] bytes, so that [`inline_key`] orders them?
pub fn strings_fit_inline(a: &ArrayRef, b: &ArrayRef) -> Result<bool> {
    let fits = |x: &ArrayRef| -> Result<bool> {
        let Some((values, _)) = crate::keys::list_parts(x)? else { return Ok(false) };
        Ok(longest_string(&values).is_some_and(|l| l <= INLINE_STRING_BYTES))
    };
    Ok(fits(a)? && fits(b)?)
}

/// The longest string's length in bytes (NULL slots count as what they
/// hold); None for values that are not strings.
fn longest_string(values: &ArrayRef) -> Option<usize> {
    let longest = match values.data_type() {
        DataType::Utf8 => values.as_string::<i32>().offsets().windows(2).map(|w| (w[1] - w[0]) as usize).max(),
        DataType::LargeUtf8 => values.as_string::<i64>().offsets().windows(2).map(|w| (w[1] - w[0]) as usize).max(),
        DataType::Utf8View => values.as_string_view().views().iter().map(|v| *v as u32 as usize).max(),
        _ => return None,
    };
    Some(longest.unwrap_or(0))
}

/// A row of at least this many elements is read and written by the host's
/// threads in pieces. A batch of one long row (`sorted_intersect` over two
/// lists of 10^7 elements: seed 004's SISI from SQL) was packed by its
/// partition's thread alone, two passes over each side: 65-92 ms on the
/// H200 against 13-18 ms before batches were packed (BENCHMARKS section 47).
const LONG_ROW: usize = 1 << 20;

/// `s..e` in pieces for the host's threads.
fn row_pieces(s: usize, e: usize) -> Vec<(usize, usize)> {
    let per = (e - s).div_ceil(crate::host::copy_threads().max(1)).max(1 << 16);
    (s..e).step_by(per).map(|a| (a, (a + per).min(e))).collect()
}

/// The first pass over one piece of a row: its kept elements, whether they
/// ascend, the first and last, the least and greatest.
#[derive(Debug, Clone, Copy, Default)]
struct PieceFacts {
    n: usize,
    ascending: bool,
    ends: Option<(u64, u64)>,
    lo: u64,
    hi: u64,
}

fn scan_piece(img: &(impl Fn(usize) -> u64 + Sync), elem_nulls: Option<&NullBuffer>, a: usize, b: usize) -> PieceFacts {
    let mut f = PieceFacts { ascending: true, lo: u64::MAX, ..Default::default() };
    for j in present(a, b, elem_nulls) {
        let x = img(j);
        f.ends = Some(match f.ends {
            None => (x, x),
            Some((first, last)) => {
                f.ascending &= last <= x;
                (first, x)
            }
        });
        f.lo = f.lo.min(x);
        f.hi = f.hi.max(x);
        f.n += 1;
    }
    f
}

/// First pass over one side: kept elements per row, order, image range.
fn scan_side(
    img: impl Fn(usize) -> u64 + Sync,
    elem_nulls: Option<&NullBuffer>,
    ranges: &[(usize, usize)],
    valid: &[u8],
) -> Result<SideFacts> {
    let mut offsets = Vec::with_capacity(ranges.len() + 1);
    offsets.push(0u32);
    let (mut n, mut ascending, mut lo, mut hi) = (0usize, true, u64::MAX, 0u64);
    for (r, &(s, e)) in ranges.iter().enumerate() {
        if valid[r] != 0 && e - s >= LONG_ROW {
            let mut parts: Vec<((usize, usize), PieceFacts)> =
                row_pieces(s, e).into_iter().map(|p| (p, PieceFacts::default())).collect();
            crate::host::for_each_mut(&mut parts, &|_, ((a, b), f)| *f = scan_piece(&img, elem_nulls, *a, *b));
            // The pieces in order: each ascends, and each begins at or above the last one's end.
            let mut last: Option<u64> = None;
            for (_, f) in &parts {
                if let Some((first, end)) = f.ends {
                    ascending &= f.ascending && last.is_none_or(|l| l <= first);
                    last = Some(end);
                    (lo, hi, n) = (lo.min(f.lo), hi.max(f.hi), n + f.n);
                }
            }
        } else if valid[r] != 0 {
            let mut prev = 0u64;
            let mut first = true;
            let mut visit = |x: u64| {
                ascending &= first || prev <= x;
                first = false;
                prev = x;
                lo = lo.min(x);
                hi = hi.max(x);
                n += 1;
            };
            present(s, e, elem_nulls).for_each(|j| visit(img(j)));
        }
        if n >= u32::MAX as usize {
            return Err(DataFusionError::Plan(format!(
                "list functions on the GPU: more than {} elements in one batch's argument",
                u32::MAX - 1
            )));
        }
        offsets.push(n as u32);
    }
    Ok(SideFacts { offsets, ascending, range: (n > 0).then_some((lo, hi)) })
}

/// Second pass over one side: its kept elements' keys into `out` (a long
/// row's pieces on the host's threads, each into its own part of `out`).
fn write_side(
    img: impl Fn(usize) -> u64 + Sync,
    elem_nulls: Option<&NullBuffer>,
    ranges: &[(usize, usize)],
    valid: &[u8],
    frame: (u64, bool),
    out: &mut [u8],
) {
    let width = if frame.1 { 8 } else { 4 };
    let mut at = 0usize;
    for (r, &(s, e)) in ranges.iter().enumerate() {
        if valid[r] == 0 {
            continue;
        }
        if e - s < LONG_ROW {
            at += put_keys(&img, elem_nulls, s, e, frame, &mut out[at..]);
            continue;
        }
        let pieces = row_pieces(s, e);
        let bytes: Vec<usize> = pieces
            .iter()
            .map(|&(a, b)| width * ((b - a) - elem_nulls.map_or(0, |nb| nb.slice(a, b - a).null_count())))
            .collect();
        let written: usize = bytes.iter().sum();
        let mut parts: Vec<((usize, usize), &mut [u8])> =
            pieces.into_iter().zip(crate::host::split_mut(&mut out[at..], bytes)).collect();
        at += written;
        crate::host::for_each_mut(&mut parts, &|_, ((a, b), dst)| {
            put_keys(&img, elem_nulls, *a, *b, frame, dst);
        });
    }
}

/// The keys of `a..b`'s kept elements into `out`: u32 offsets from `base`,
/// or whole images when `wide`. Returns the bytes written.
fn put_keys(
    img: &impl Fn(usize) -> u64,
    elem_nulls: Option<&NullBuffer>,
    a: usize,
    b: usize,
    (base, wide): (u64, bool),
    out: &mut [u8],
) -> usize {
    let mut at = 0usize;
    for j in present(a, b, elem_nulls) {
        let x = img(j);
        if wide {
            out[at..at + 8].copy_from_slice(&x.to_ne_bytes());
            at += 8;
        } else {
            out[at..at + 4].copy_from_slice(&((x - base) as u32).to_ne_bytes());
            at += 4;
        }
    }
    at
}

/// The indices of `s..e` whose element is not NULL (the order both passes visit).
fn present(s: usize, e: usize, elem_nulls: Option<&NullBuffer>) -> impl Iterator<Item = usize> + '_ {
    (s..e).filter(move |&j| elem_nulls.is_none_or(|nb| nb.is_valid(j)))
}

fn element_nulls(values: &ArrayRef) -> Option<&NullBuffer> {
    values.nulls().filter(|n| n.null_count() > 0)
}

/// The first pass: the batch's two arguments read. `tiles_vt`: the Balanced
/// Path tile (inputs a tile) to lay tiles out for; `bound`: the rule's row bound.
fn plan_sides<T: ListKey>(sa: &Side, sb: &Side, rows: usize, tiles_vt: Option<u32>, bound: RowBound) -> Result<Plan> {
    if sb.ranges.len() != rows {
        return Err(DataFusionError::Internal(format!(
            "list function: argument lengths differ ({rows} and {})",
            sb.ranges.len()
        )));
    }
    if rows >= u32::MAX as usize {
        return Err(DataFusionError::Plan(format!("list functions on the GPU: {rows} rows exceed 2^32 - 1")));
    }
    for side in [sa, sb] {
        if side.values.as_ref().and_then(longest_string).is_some_and(|l| l > INLINE_STRING_BYTES) {
            return Err(long_strings());
        }
    }
    let (nulls, valid) = result_rows(sa, sb, rows);
    let scan = |s: &Side| -> Result<SideFacts> {
        match &s.values {
            None => Ok(SideFacts { offsets: vec![0; rows + 1], ascending: true, range: None }),
            Some(values) => {
                with_images!(values, T, |img| scan_side(img, element_nulls(values), &s.ranges, &valid))
            }
        }
    };
    let sides = [scan(sa)?, scan(sb)?];
    let (ca, cb) = (sides[0].n(), sides[1].n());
    if ca + cb >= u32::MAX as usize {
        // Positions in a row's merge (and its output) are u32 on the device.
        return Err(DataFusionError::Plan(format!(
            "list functions on the GPU: {} elements in one batch exceed 2^32 - 1",
            ca + cb
        )));
    }
    let (base, max) = match (sides[0].range, sides[1].range) {
        (Some((l0, h0)), Some((l1, h1))) => (l0.min(l1), h0.max(h1)),
        (Some(r), None) | (None, Some(r)) => r,
        (None, None) => (0, 0),
    };
    let wide = max - base > u32::MAX as u64;
    let (oa, ob) = (&sides[0].offsets, &sides[1].offsets);
    let len = |r: usize, o: &[u32]| (o[r + 1] - o[r]) as usize;
    let tiles = tiles_vt.map(|vt| {
        let mut t = Vec::with_capacity(rows + 1);
        t.push(0u32);
        let mut total = 0u32;
        for r in 0..rows {
            // Rows whose result is NULL kept no element, so they have no tile.
            total += (len(r, oa) + len(r, ob)).div_ceil(vt as usize) as u32;
            t.push(total);
        }
        t
    });
    let bound = (0..rows).map(|r| bound.of(len(r, oa), len(r, ob))).sum();
    let width = if wide { 8 } else { 4 };
    let mut at = Places(rows.next_multiple_of(16));
    let offsets = [at.take((rows + 1) * 4), at.take((rows + 1) * 4)];
    let tiles_at = tiles.as_ref().map(|_| at.take((rows + 1) * 4));
    let keys = [at.take(ca * width), at.take(cb * width)];
    let layout = Layout { offsets, tiles: tiles_at, keys, raw: None, bytes: at.0 };
    Ok(Plan { rows, nulls, valid, sides, base, max, wide, tiles, bound, layout })
}

/// The result's NULL rows (a NULL list, or a NULL-typed argument, on either
/// side) and one validity byte per row.
fn result_rows(sa: &Side, sb: &Side, rows: usize) -> (Option<NullBuffer>, Vec<u8>) {
    let nulls = if sa.values.is_none() || sb.values.is_none() {
        Some(NullBuffer::new_null(rows))
    } else {
        NullBuffer::union(sa.nulls.as_ref(), sb.nulls.as_ref())
    };
    let valid: Vec<u8> = (0..rows).map(|i| (sa.is_valid(i) && sb.is_valid(i)) as u8).collect();
    (nulls, valid)
}

/// Byte positions handed out one after another, each 16-aligned.
struct Places(usize);

impl Places {
    fn take(&mut self, bytes: usize) -> usize {
        let here = self.0;
        self.0 = (self.0 + bytes).next_multiple_of(16);
        here
    }
}

/// The elements `start..end` of a side's values that a raw batch sends (its
/// rows follow one another), and how, when the side can travel raw: no NULL
/// element, values of an integer type or strings (their lengths checked by
/// [`write_raw`]: at most 7 bytes).
fn raw_side(side: &Side) -> Option<(usize, usize, RawImages)> {
    let values = side.values.as_ref()?;
    if element_nulls(values).is_some() || !side.ranges.windows(2).all(|w| w[0].1 == w[1].0) {
        return None;
    }
    let (start, end) = side.span();
    let ints = |width: usize, signed: bool| Some(RawImages::Ints { width, signed });
    let raw = match values.data_type() {
        DataType::Int8 => ints(1, true),
        DataType::Int16 => ints(2, true),
        DataType::Int32 => ints(4, true),
        DataType::Int64 => ints(8, true),
        DataType::UInt8 => ints(1, false),
        DataType::UInt16 => ints(2, false),
        DataType::UInt32 => ints(4, false),
        DataType::UInt64 => ints(8, false),
        DataType::Utf8 => {
            let o = values.as_string::<i32>().value_offsets();
            Some(RawImages::Strings { offsets_at: 0, bytes: (o[end] - o[start]) as usize })
        }
        DataType::LargeUtf8 => {
            let o = values.as_string::<i64>().value_offsets();
            Some(RawImages::Strings { offsets_at: 0, bytes: (o[end] - o[start]) as usize })
        }
        DataType::Utf8View => Some(RawImages::Views),
        _ => None,
    }?;
    let fits = end - start < u32::MAX as usize && raw.value_bytes(end - start) < u32::MAX as usize;
    fits.then_some((start, end, raw))
}

/// The first pass of a raw batch (multiset rules only, whose device path
/// sorts every row: nothing is learned per element). Each side's values go
/// in their own Arrow bytes, those of NULL result rows included (those rows
/// get no tile, so no kernel reads them), and the device makes the key
/// images: on the host only the rows are visited, and the values copied once.
/// None where a side cannot travel raw ([`raw_side`]).
fn plan_raw<T: ListKey>(sa: &Side, sb: &Side, rows: usize, vt: u32, bound: RowBound) -> Result<Option<Plan>> {
    let (Some(ra), Some(rb)) = (raw_side(sa), raw_side(sb)) else { return Ok(None) };
    if sb.ranges.len() != rows || rows >= u32::MAX as usize || (ra.1 - ra.0) + (rb.1 - rb.0) >= u32::MAX as usize {
        return Ok(None); // the packed path words these
    }
    let (nulls, valid) = result_rows(sa, sb, rows);
    let facts = |side: &Side, start: usize, end: usize| {
        let mut offsets: Vec<u32> = side.ranges.iter().map(|r| (r.0 - start) as u32).collect();
        offsets.push((end - start) as u32);
        SideFacts { offsets, ascending: false, range: None }
    };
    let sides = [facts(sa, ra.0, ra.1), facts(sb, rb.0, rb.1)];
    let (oa, ob) = (&sides[0].offsets, &sides[1].offsets);
    let len = |r: usize, o: &[u32]| (o[r + 1] - o[r]) as usize;
    let mut tiles = Vec::with_capacity(rows + 1);
    tiles.push(0u32);
    let (mut total, mut bound_total) = (0u64, 0usize);
    for r in 0..rows {
        if valid[r] != 0 {
            total += (len(r, oa) + len(r, ob)).div_ceil(vt as usize) as u64;
            bound_total += bound.of(len(r, oa), len(r, ob));
        }
        tiles.push(total as u32);
    }
    if total >= u32::MAX as u64 {
        return Ok(None);
    }
    // The device sorts rows longer than its block sort takes by their images' bits: the
    // integers' range costs one pass over the values then; strings sort on all 64 bits.
    let longest = sides[0].longest().max(sides[1].longest());
    let (base, max) = match (ra.2, longest > ROW_SORT_MAX) {
        (RawImages::Ints { .. }, true) => {
            let range = |side: &Side, (s, e): (usize, usize)| -> Result<Option<(u64, u64)>> {
                let values = side.values.as_ref().expect("a raw side has values");
                with_images!(values, T, |img| Ok::<_, DataFusionError>(
                    (s..e)
                        .map(img)
                        .fold(None, |m: Option<(u64, u64)>, x| Some(m.map_or((x, x), |(l, h)| (l.min(x), h.max(x)))))
                ))
            };
            match (range(sa, (ra.0, ra.1))?, range(sb, (rb.0, rb.1))?) {
                (Some((l0, h0)), Some((l1, h1))) => (l0.min(l1), h0.max(h1)),
                (Some(r), None) | (None, Some(r)) => r,
                (None, None) => (0, 0),
            }
        }
        _ => (0, u64::MAX),
    };
    let mut at = Places(rows.next_multiple_of(16));
    let offsets = [at.take((rows + 1) * 4), at.take((rows + 1) * 4)];
    let tiles_at = Some(at.take((rows + 1) * 4));
    let mut place = |(start, end, raw): (usize, usize, RawImages)| {
        let n = end - start;
        let raw = match raw {
            RawImages::Strings { bytes, .. } => RawImages::Strings { offsets_at: at.take((n + 1) * 4), bytes },
            other => other,
        };
        (at.take(raw.value_bytes(n)), raw)
    };
    let ((ka, xa), (kb, xb)) = (place(ra), place(rb));
    let layout = Layout { offsets, tiles: tiles_at, keys: [ka, kb], raw: Some([xa, xb]), bytes: at.0 };
    let plan =
        Plan { rows, nulls, valid, sides, base, max, wide: true, tiles: Some(tiles), bound: bound_total, layout };
    Ok(Some(plan))
}

/// A batch's two arguments read and packed (both passes) into a buffer
/// `alloc(bytes)` returns: the device path's loan, or a test's memory.
pub fn pack<T: ListKey, B: AsMut<[u8]>>(
    a: &ArrayRef,
    b: &ArrayRef,
    tiles_vt: Option<u32>,
    bound: RowBound,
    alloc: impl FnOnce(usize) -> Result<B>,
) -> Result<(Plan, Option<B>)> {
    let (sa, sb) = (Side::read::<T>(a)?, Side::read::<T>(b)?);
    let raw = match tiles_vt {
        Some(vt) => plan_raw::<T>(&sa, &sb, a.len(), vt, bound)?,
        None => None,
    };
    let plan = match raw {
        Some(plan) => plan,
        None => plan_sides::<T>(&sa, &sb, a.len(), tiles_vt, bound)?,
    };
    if plan.is_empty() {
        return Ok((plan, None));
    }
    let mut buf = alloc(plan.layout.bytes)?;
    match plan.layout.raw {
        Some(raw) => write_raw(&plan, raw, &sa, &sb, buf.as_mut())?,
        None => write::<T>(&plan, &sa, &sb, buf.as_mut())?,
    }
    Ok((plan, Some(buf)))
}

/// Validity, offsets and tiles at their places in `out`.
fn write_rows(plan: &Plan, out: &mut [u8]) -> Result<()> {
    let l = &plan.layout;
    if out.len() < l.bytes {
        return Err(DataFusionError::Internal(format!("list packing: {} bytes for {}", out.len(), l.bytes)));
    }
    out[..plan.rows].copy_from_slice(&plan.valid);
    for s in 0..2 {
        put_u32s(out, l.offsets[s], &plan.sides[s].offsets);
    }
    if let (Some(at), Some(t)) = (l.tiles, &plan.tiles) {
        put_u32s(out, at, t);
    }
    Ok(())
}

fn put_u32s(out: &mut [u8], at: usize, v: &[u32]) {
    for (d, x) in out[at..at + 4 * v.len()].chunks_exact_mut(4).zip(v) {
        d.copy_from_slice(&x.to_ne_bytes());
    }
}

/// The second pass of a raw batch: rows as [`write`] does, then each side's
/// values copied in their own bytes (strings: offsets from 0, then data).
fn write_raw(plan: &Plan, raw: [RawImages; 2], sa: &Side, sb: &Side, out: &mut [u8]) -> Result<()> {
    write_rows(plan, out)?;
    for (s, side) in [sa, sb].into_iter().enumerate() {
        let Some(values) = &side.values else { continue };
        let (start, end) = side.span();
        let (n, at) = (end - start, plan.layout.keys[s]);
        let dst = &mut out[at..at + raw[s].value_bytes(n)];
        match raw[s] {
            RawImages::Ints { width, .. } => {
                let data = values.to_data();
                let from = (data.offset() + start) * width;
                dst.copy_from_slice(&data.buffers()[0].as_slice()[from..from + n * width]);
            }
            RawImages::Views => {
                // Copied with their lengths checked in the same pass.
                let mut longest = 0u32;
                for (d, v) in dst.chunks_exact_mut(16).zip(&values.as_string_view().views()[start..end]) {
                    longest = longest.max(*v as u32);
                    d.copy_from_slice(&v.to_le_bytes());
                }
                if longest as usize > INLINE_STRING_BYTES {
                    return Err(long_strings());
                }
            }
            RawImages::Strings { offsets_at, .. } => {
                // Offsets rebased to the span's first string, as u32, the strings' lengths
                // checked in the same pass.
                macro_rules! strings {
                    ($o:ty) => {{
                        let v = values.as_string::<$o>();
                        let (o, data) = (&v.value_offsets()[start..=end], v.value_data());
                        dst.copy_from_slice(&data[o[0] as usize..o[n] as usize]);
                        let (first, mut prev, mut longest) = (o[0], o[0], 0);
                        for (d, &x) in out[offsets_at..offsets_at + 4 * (n + 1)].chunks_exact_mut(4).zip(o) {
                            longest = longest.max(x - prev);
                            prev = x;
                            d.copy_from_slice(&((x - first) as u32).to_ne_bytes());
                        }
                        longest as usize
                    }};
                }
                let longest = match values.data_type() {
                    DataType::LargeUtf8 => strings!(i64),
                    _ => strings!(i32),
                };
                if longest > INLINE_STRING_BYTES {
                    return Err(long_strings());
                }
            }
        }
    }
    Ok(())
}

/// The second pass: validity, offsets, tiles and keys at their places in `out`.
fn write<T: ListKey>(plan: &Plan, sa: &Side, sb: &Side, out: &mut [u8]) -> Result<()> {
    write_rows(plan, out)?;
    let l = &plan.layout;
    let width = if plan.wide { 8 } else { 4 };
    for (s, side) in [sa, sb].into_iter().enumerate() {
        let n = plan.sides[s].n();
        let Some(values) = &side.values else { continue };
        if n == 0 {
            continue;
        }
        let dst = &mut out[l.keys[s]..l.keys[s] + n * width];
        with_images!(values, T, |img| {
            write_side(img, element_nulls(values), &side.ranges, &plan.valid, (plan.base, plan.wide), dst);
            Ok::<(), DataFusionError>(())
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int16Array, Int32Array, ListArray, UInt32Array};
    use datafusion::arrow::buffer::OffsetBuffer;
    use datafusion::arrow::datatypes::Field;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::keys::ListColumn;

    /// Unpack side `s` of a packed batch into its rows' values (as `T`).
    fn unpack<T: ListKey>(plan: &Plan, buf: &[u8], s: usize) -> Vec<Vec<T>> {
        let l = &plan.layout;
        let u32_at = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
        let offsets: Vec<u32> = (0..=plan.rows).map(|r| u32_at(l.offsets[s] + 4 * r)).collect();
        assert_eq!(offsets, plan.sides[s].offsets);
        // A raw batch's images as the device makes them (the kernels' CPU twin).
        let raw_images = l.raw.map(|raw| {
            let n = plan.sides[s].n();
            let string_offsets = match raw[s] {
                RawImages::Strings { offsets_at, .. } => &buf[offsets_at..offsets_at + 4 * (n + 1)],
                _ => &[][..],
            };
            raw[s].images_cpu(&buf[l.keys[s]..l.keys[s] + raw[s].value_bytes(n)], string_offsets, n, T::FLIP)
        });
        let key = |k: usize| -> u64 {
            if let Some(images) = &raw_images {
                images[k]
            } else if plan.wide {
                u64::from_ne_bytes(buf[l.keys[s] + 8 * k..l.keys[s] + 8 * k + 8].try_into().unwrap())
            } else {
                plan.base + u32_at(l.keys[s] + 4 * k) as u64
            }
        };
        // A raw batch keeps the elements of NULL result rows; no kernel reads them.
        (0..plan.rows)
            .map(|r| {
                let kept = if plan.valid[r] != 0 { offsets[r]..offsets[r + 1] } else { 0..0 };
                kept.map(|k| T::from_image(key(k as usize))).collect()
            })
            .collect()
    }

    /// The rows the CPU twin reads (cast to `T`, NULL elements dropped; empty for a NULL result).
    fn want_rows<T: ListKey>(a: &ArrayRef, b: &ArrayRef, x: &ArrayRef) -> Vec<Vec<T>> {
        let (ca, cb, cx) = (
            ListColumn::new(a, &T::data_type()).unwrap(),
            ListColumn::new(b, &T::data_type()).unwrap(),
            ListColumn::new(x, &T::data_type()).unwrap(),
        );
        (0..a.len())
            .map(|i| {
                if !(ca.is_valid(i) && cb.is_valid(i)) {
                    return Vec::new();
                }
                let (s, e) = cx.ranges[i];
                let vals = cx.values.as_ref().unwrap();
                let v = T::values(vals);
                (s..e).filter(|&j| vals.is_valid(j)).map(|j| v[j]).collect()
            })
            .collect()
    }

    fn list_of(values: ArrayRef, lens: &[usize], nulls: Option<NullBuffer>) -> ArrayRef {
        let field = Arc::new(Field::new_list_field(values.data_type().clone(), true));
        Arc::new(ListArray::new(field, OffsetBuffer::from_lengths(lens.iter().copied()), values, nulls))
    }

    fn random_lists(rng: &mut rand::rngs::StdRng, rows: usize, kind: u32, domain: i64) -> ArrayRef {
        random_lists_with(rng, rows, kind, domain, 0.05)
    }

    /// Lists of `kind` 0-3 (Int32, Int16, UInt32, Int64) whose elements are NULL with probability `null_elements`.
    fn random_lists_with(
        rng: &mut rand::rngs::StdRng,
        rows: usize,
        kind: u32,
        domain: i64,
        null_elements: f64,
    ) -> ArrayRef {
        let lens: Vec<usize> =
            (0..rows).map(|_| if rng.random_bool(0.1) { 0 } else { rng.random_range(0..40) }).collect();
        let n: usize = lens.iter().sum();
        let present = |rng: &mut rand::rngs::StdRng| !rng.random_bool(null_elements);
        let values: ArrayRef = match kind {
            0 => Arc::new(Int32Array::from_iter(
                (0..n).map(|_| present(rng).then(|| rng.random_range(-domain..domain) as i32)),
            )),
            1 => Arc::new(Int16Array::from_iter(
                (0..n).map(|_| present(rng).then(|| rng.random_range(-300..300) as i16)),
            )),
            2 => Arc::new(UInt32Array::from_iter(
                (0..n).map(|_| present(rng).then(|| rng.random_range(0..domain) as u32)),
            )),
            _ => Arc::new(datafusion::arrow::array::Int64Array::from_iter(
                (0..n).map(|_| present(rng).then(|| rng.random_range(-domain..domain))),
            )),
        };
        let nulls = NullBuffer::from_iter((0..rows).map(|_| !rng.random_bool(0.1)));
        list_of(values, &lens, Some(nulls))
    }

    fn check<T: ListKey>(a: &ArrayRef, b: &ArrayRef) {
        for (vt, bound) in [(Some(16), RowBound::Min), (None, RowBound::Sum), (Some(1), RowBound::First)] {
            let (plan, buf) = pack::<T, Vec<u8>>(a, b, vt, bound, |n| Ok(vec![0xee; n])).unwrap();
            let Some(buf) = buf else {
                assert!(plan.is_empty());
                continue;
            };
            for (s, x) in [(0, a), (1, b)] {
                let got = unpack::<T>(&plan, &buf, s);
                assert_eq!(got, want_rows::<T>(a, b, x), "side {s}");
                let ascending = got.iter().all(|r| r.windows(2).all(|w| w[0] <= w[1]));
                // A raw batch learns nothing per element: its rows are always sorted on the device.
                assert_eq!(plan.sides[s].ascending, ascending && plan.layout.raw.is_none());
            }
            let (ra, rb) = (unpack::<T>(&plan, &buf, 0), unpack::<T>(&plan, &buf, 1));
            let want_bound: usize = ra.iter().zip(&rb).map(|(x, y)| bound.of(x.len(), y.len())).sum();
            assert_eq!(plan.bound, want_bound);
            if let Some(vt) = vt {
                let t = plan.tiles.as_ref().unwrap();
                for r in 0..plan.rows {
                    assert_eq!((t[r + 1] - t[r]) as usize, (ra[r].len() + rb[r].len()).div_ceil(vt as usize));
                }
            }
        }
    }

    /// Native Int32 / Int16 / UInt32 and Int64 values, NULL lists and
    /// elements, slices, narrow and whole-u64 frames: the packed rows equal the
    /// CPU twin's cast rows.
    #[test]
    fn packed_rows_equal_the_cast_rows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        for round in 0..24u32 {
            let kind = round % 4;
            let domain = if round % 3 == 0 { i64::MAX / 2 } else { 50 };
            let rows = 1 + rng.random_range(0..60);
            let (a, b) =
                (random_lists(&mut rng, rows + 2, kind, domain), random_lists(&mut rng, rows + 2, kind, domain));
            let (a, b) = (a.slice(1, rows), b.slice(2, rows));
            if kind == 2 {
                check::<u64>(&a, &b);
            }
            check::<i64>(&a, &b);
        }
        // Short strings pack as their inline keys; a longer one is refused.
        let words = |v: Vec<Option<&str>>, lens: &[usize]| {
            list_of(Arc::new(datafusion::arrow::array::StringArray::from(v)), lens, None)
        };
        let a = words(vec![Some("b"), None, Some("a\0"), Some(""), Some("zzzzzzz")], &[2, 3]);
        let b = words(vec![Some("a"), Some("é")], &[1, 1]);
        let (plan, buf) = pack::<u64, Vec<u8>>(&a, &b, Some(16), RowBound::Sum, |n| Ok(vec![0; n])).unwrap();
        let key = |w: &str| crate::keys::inline_key(w.as_bytes());
        assert_eq!(
            unpack::<u64>(&plan, &buf.unwrap(), 0),
            vec![vec![key("b")], vec![key("a\0"), key(""), key("zzzzzzz")]]
        );
        assert!(!plan.sides[0].ascending && plan.sides[1].ascending);
        let long = words(vec![Some("abcdefgh")], &[1]);
        assert!(strings_fit_inline(&a, &b).unwrap() && !strings_fit_inline(&a, &long).unwrap());
        assert!(pack::<u64, Vec<u8>>(&long, &long, None, RowBound::Min, |n| Ok(vec![0; n])).is_err());
        // ... on the raw path too (checked in its pass over the strings), and as views.
        assert!(pack::<u64, Vec<u8>>(&long, &long, Some(16), RowBound::Min, |n| Ok(vec![0; n])).is_err());
        let long_views =
            list_of(Arc::new(datafusion::arrow::array::StringViewArray::from(vec!["abcdefgh"])), &[1], None);
        assert!(pack::<u64, Vec<u8>>(&long_views, &long_views, Some(16), RowBound::Min, |n| Ok(vec![0; n])).is_err());
        // Sorted rows are found ascending; a NULL-typed argument makes every row NULL.
        let sorted = list_of(Arc::new(Int32Array::from(vec![1, 2, 2, 5, -3, 0])), &[4, 2], None);
        let (plan, _) = pack::<i64, Vec<u8>>(&sorted, &sorted, None, RowBound::Min, |n| Ok(vec![0; n])).unwrap();
        assert!(plan.sides[0].ascending && !plan.wide && plan.base == (-3i64 as u64) ^ (1 << 63));
        let null: ArrayRef = Arc::new(datafusion::arrow::array::NullArray::new(2));
        let (plan, buf) = pack::<i64, Vec<u8>>(&sorted, &null, None, RowBound::Min, |n| Ok(vec![0; n])).unwrap();
        assert!(buf.is_none() && plan.nulls.as_ref().is_some_and(|n| n.null_count() == 2));
    }

    /// Rows long enough to be packed in pieces by the host's threads (NULL
    /// elements among them, so the packed path takes them) give the same
    /// rows, and their order is found across the pieces: pieces that each
    /// ascend but begin below the last one's end do not.
    #[test]
    fn long_rows_pack_in_pieces() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(33);
        let n = LONG_ROW + 70_001;
        let pieces = row_pieces(2, 2 + n);
        for order in ["sorted", "random", "each piece sorted"] {
            let mut v: Vec<i32> = (0..n + 5).map(|_| rng.random_range(-1000..1000)).collect();
            match order {
                "sorted" => v.sort_unstable(),
                "each piece sorted" => {
                    // The long row of `a` starts at value 2: each piece ascends from a lower start than the last.
                    for (k, &(p, q)) in pieces.iter().enumerate() {
                        for j in p..q {
                            v[j] = (pieces.len() - k) as i32 * 10_000 + ((j - p) / 100) as i32;
                        }
                    }
                }
                _ => {}
            }
            let nulls = NullBuffer::from((0..n + 5).map(|j| j % 97 != 3).collect::<Vec<bool>>());
            let values: ArrayRef = Arc::new(Int32Array::new(v.into(), Some(nulls)));
            let a = list_of(values.clone(), &[2, n, 3], None);
            let b = list_of(values, &[n, 4, 1], None);
            check::<i64>(&a, &b);
        }
    }

    /// Batches without NULL elements travel raw (multiset rules): integers of
    /// every width, Utf8, LargeUtf8 and Utf8View strings, NULL lists among
    /// them, sliced, unpack through the image kernels' CPU twin to the CPU
    /// twin's rows; a row longer than the block sort takes gives the
    /// integers' true range, strings the whole u64 range.
    #[test]
    fn raw_batches_unpack_to_the_cast_rows() {
        use datafusion::arrow::array::{LargeStringArray, StringArray, StringViewArray};
        use datafusion::arrow::compute::cast;
        let mut rng = rand::rngs::StdRng::seed_from_u64(32);
        let raw = |a: &ArrayRef, b: &ArrayRef, signed: bool| {
            let (plan, _) = if signed {
                pack::<i64, Vec<u8>>(a, b, Some(16), RowBound::Min, |n| Ok(vec![0; n])).unwrap()
            } else {
                pack::<u64, Vec<u8>>(a, b, Some(16), RowBound::Min, |n| Ok(vec![0; n])).unwrap()
            };
            plan.layout.raw.is_some()
        };
        for round in 0..16u32 {
            let kind = round % 4;
            let rows = 1 + rng.random_range(0..50);
            let (a, b) = (
                random_lists_with(&mut rng, rows + 3, kind, 100, 0.0),
                random_lists_with(&mut rng, rows + 3, kind, 100, 0.0),
            );
            let (a, b) = (a.slice(1, rows), b.slice(3, rows));
            check::<i64>(&a, &b);
            assert!(raw(&a, &b, true), "round {round}");
            // Other widths, by a cast of the elements.
            let field = |t: &DataType| Arc::new(Field::new_list_field(t.clone(), true));
            for t in [DataType::Int8, DataType::UInt8, DataType::UInt16, DataType::UInt64, DataType::Int64] {
                if kind == 2 || t == DataType::Int64 || t == DataType::Int8 {
                    let to = DataType::List(field(&t));
                    let (ca, cb) = (cast(&a, &to), cast(&b, &to));
                    let (Ok(ca), Ok(cb)) = (ca, cb) else { continue };
                    check::<i64>(&ca, &cb);
                    if matches!(t, DataType::UInt8 | DataType::UInt16 | DataType::UInt64) {
                        check::<u64>(&ca, &cb);
                        assert!(raw(&ca, &cb, false));
                    }
                }
            }
        }
        // Strings: Utf8, LargeUtf8 and Utf8View of at most 7 bytes, empty and NUL-holding ones among them.
        let words = ["", "a", "a\0", "b", "zzzzzzz", "é", "ab", "abc", "a"];
        let pick = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<&str> {
            (0..n).map(|_| words[rng.random_range(0..words.len())]).collect()
        };
        for round in 0..6 {
            let lens: Vec<usize> = (0..20).map(|_| rng.random_range(0..6)).collect();
            let n: usize = lens.iter().sum();
            let (wa, wb) = (pick(&mut rng, n), pick(&mut rng, n));
            let nulls = NullBuffer::from_iter((0..20).map(|i| i % 7 != 3));
            let make = |w: &[&str]| -> ArrayRef {
                match round % 3 {
                    0 => Arc::new(StringArray::from(w.to_vec())),
                    1 => Arc::new(LargeStringArray::from(w.to_vec())),
                    _ => Arc::new(StringViewArray::from(w.to_vec())),
                }
            };
            let (a, b) = (list_of(make(&wa), &lens, Some(nulls)), list_of(make(&wb), &lens, None));
            let (a, b) = (a.slice(2, 17), b.slice(1, 17));
            let (plan, buf) = pack::<u64, Vec<u8>>(&a, &b, Some(16), RowBound::Sum, |n| Ok(vec![0; n])).unwrap();
            assert!(plan.layout.raw.is_some() && plan.base == 0 && plan.max == u64::MAX);
            let buf = buf.unwrap();
            for (s, x) in [(0, &a), (1, &b)] {
                let col = ListColumn::new(x, &DataType::Utf8).unwrap();
                let strings = col.values.as_ref().unwrap().as_string::<i32>().clone();
                let want: Vec<Vec<u64>> = (0..17)
                    .map(|i| {
                        if plan.valid[i] == 0 {
                            return Vec::new();
                        }
                        let (st, e) = col.ranges[i];
                        (st..e).map(|j| crate::keys::inline_key(strings.value(j).as_bytes())).collect()
                    })
                    .collect();
                assert_eq!(unpack::<u64>(&plan, &buf, s), want, "round {round} side {s}");
            }
        }
        // A row longer than the block sort: the integers' true range.
        let long = list_of(Arc::new(Int32Array::from_iter_values((0..3000).map(|i| i - 7))), &[3000], None);
        let (plan, _) = pack::<i64, Vec<u8>>(&long, &long, Some(16), RowBound::Min, |n| Ok(vec![0; n])).unwrap();
        assert!(plan.layout.raw.is_some());
        assert_eq!((plan.base, plan.max), ((-7i64 as u64) ^ (1 << 63), (2992i64 as u64) ^ (1 << 63)));
        // NULL elements keep the packed path.
        let mut rng = rand::rngs::StdRng::seed_from_u64(33);
        let (a, b) = (random_lists_with(&mut rng, 40, 0, 50, 0.3), random_lists_with(&mut rng, 40, 0, 50, 0.0));
        assert!(!raw(&a, &b, true));
    }
}
