//! Arrow key columns -> 64-bit device keys.
//!
//! One fixed-width column of at most 64 bits becomes its own value (exact: two
//! keys are equal iff the SQL values are equal). Everything else becomes a
//! 64-bit hash of exact key bytes ([`KeyBytes`]):
//! - one string or binary column is hashed over its values' bytes as Arrow
//!   holds them (no copy, no row encoding; on the GPU backend the device reads
//!   the offsets or views and the value buffers itself): [`KeyBytes::Values`];
//! - composite keys whose every column is exact on its own or a string /
//!   binary column (e.g. (VARCHAR, INT, DATE)) are hashed column by column
//!   ([`KeyBytes::Columns`], [`ColumnKeys`]): each exact column as its 64-bit
//!   image (floats canonical, NULL slots 0), each string column as its values
//!   (NULL slots empty), plus, where a key column holds NULLs, one 64-bit NULL
//!   mask per row (bit c: column c is NULL). The key's hash is
//!   [`hash_columns`] of the per-column [`hash_bytes`] (of the value bytes, or
//!   of the image's 8 little-endian bytes) and the mask's; the device computes
//!   the same value column by column from the columns' own buffers. No row is
//!   encoded on these paths; only the rare exact fallback after a hash
//!   collision builds Arrow rows ([`RowSubset::iter`]);
//! - other keys (decimals wider than 18 digits, fixed-size binary, intervals
//!   in a composite key) are hashed over Arrow's row encoding ([`KeyBytes::Rows`]).
//!
//! Hashed keys are *candidates*: every match is verified on the exact bytes
//! (see [`verify_or_exact`], and its device counterpart in
//! `algo::row_hash`), so a hash collision can never change a result.
//! Column-hashed keys are verified column by column: when, for every column
//! (and the NULL mask), all rows sharing a hash hold equal values, equal
//! hashes mean equal tuples.
//!
//! Equality on floats is DataFusion's (its `=`, IS NOT DISTINCT FROM, GROUP
//! BY and joins alike): -0.0 = 0.0, and otherwise bit for bit, so a NaN
//! equals only a NaN of the same bits (the NaN `0.0 / 0.0` gives on x86 has
//! the sign bit and is not `'NaN'`). Values are normalised (-0.0 made 0.0)
//! before encoding.

pub mod lists;

pub use lists::{
    inline_bytes, inline_key, inline_key_in, inline_key_of_view, list_parts, ListColumn, INLINE_STRING_BYTES,
};

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use datafusion::arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type, Int64Type};
use datafusion::arrow::row::{RowConverter, Rows, SortField};
use datafusion::error::{DataFusionError, Result};

/// Why a key type cannot be encoded (shown in EXPLAIN as the CPU reason).
pub fn unsupported_reason(types: &[DataType]) -> Option<String> {
    for t in types {
        if !supported(t) {
            return Some(format!("key type {t} is not supported on the device"));
        }
    }
    None
}

fn supported(t: &DataType) -> bool {
    use DataType::*;
    if let Dictionary(_, v) = t {
        return supported(v);
    }
    matches!(
        t,
        Boolean
            | Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Float16
            | Float32
            | Float64
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _)
            | Duration(_)
            | Interval(_)
            | Decimal32(_, _)
            | Decimal64(_, _)
            | Decimal128(_, _)
            | Decimal256(_, _)
            | Utf8
            | LargeUtf8
            | Utf8View
            | Binary
            | LargeBinary
            | BinaryView
            | FixedSizeBinary(_)
            | Null
    )
}

/// The type a key column is encoded as: dictionaries become their values,
/// string and binary dictionaries the view type, whose views then point into
/// the dictionary's values (arrow's cast shares that buffer: 16 bytes a row,
/// no string copied). Other types are their own.
pub fn key_type(t: &DataType) -> DataType {
    use DataType::*;
    match t {
        Dictionary(_, v) => match v.as_ref() {
            Utf8 | LargeUtf8 | Utf8View => Utf8View,
            Binary | LargeBinary | BinaryView => BinaryView,
            other => key_type(other),
        },
        other => other.clone(),
    }
}

/// The encoded types ([`key_type`]) of key expressions over `schema`.
pub fn key_types(
    exprs: &[datafusion::physical_expr::PhysicalExprRef],
    schema: &datafusion::arrow::datatypes::Schema,
) -> Result<Vec<DataType>> {
    exprs.iter().map(|k| Ok(key_type(&k.data_type(schema)?))).collect()
}

/// Is a single column of this type encoded exactly (its value is the key)?
pub fn is_exact(types: &[DataType]) -> bool {
    use DataType::*;
    match types {
        [t] => match t {
            Boolean
            | Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Float32
            | Float64
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _)
            | Duration(_) => true,
            Decimal128(p, _) | Decimal64(p, _) | Decimal32(p, _) => *p <= 18,
            _ => false,
        },
        _ => false,
    }
}

/// Key columns of one side, over all its batches.
pub struct KeyColumns {
    /// One key per row (value or hash), in chunks read back to back. Exact
    /// 64-bit integer columns are borrowed from the Arrow buffers (no copy).
    /// Empty for hash-encoded keys whose hashing was deferred (see
    /// [`KeyColumns::hashes_deferred`]): the device hashes them itself.
    pub chunks: Vec<ScalarBuffer<u64>>,
    /// Rows where some key column is NULL (None: no NULLs).
    pub nulls: Option<NullBuffer>,
    /// Exact key bytes for verification (hash-encoded keys only).
    pub bytes: Option<KeyBytes>,
}

impl KeyColumns {
    pub fn len(&self) -> usize {
        match &self.bytes {
            Some(b) => b.len(),
            None => self.chunks.iter().map(|c| c.len()).sum(),
        }
    }
    /// Hash-encoded keys that were not hashed on the host: `chunks` is empty
    /// and the hashes must be computed from `bytes` ([`hash_rows`] or the device).
    pub fn hashes_deferred(&self) -> bool {
        self.bytes.is_some() && self.chunks.is_empty()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The key chunks as slices.
    pub fn slices(&self) -> Vec<&[u64]> {
        self.chunks.iter().map(|c| c.as_ref()).collect()
    }
    /// Every key, in row order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.chunks.iter().flat_map(|c| c.iter().copied())
    }
    pub fn is_null(&self, i: usize) -> bool {
        self.nulls.as_ref().is_some_and(|n| n.is_null(i))
    }
    pub fn null_count(&self) -> usize {
        self.nulls.as_ref().map_or(0, |n| n.null_count())
    }
}

/// NULL rows over all batches (a row is NULL if any key column is).
fn key_nulls(batches: &[Vec<ArrayRef>]) -> Option<NullBuffer> {
    if !batches.iter().flatten().any(|c| c.logical_null_count() > 0) {
        return None;
    }
    let mut b = datafusion::arrow::array::BooleanBufferBuilder::new(0);
    for cols in batches {
        let n =
            cols.iter().fold(None::<NullBuffer>, |acc, c| NullBuffer::union(acc.as_ref(), c.logical_nulls().as_ref()));
        match n {
            Some(n) => b.append_buffer(n.inner()),
            None => b.append_n(cols.first().map_or(0, |c| c.len()), true),
        }
    }
    Some(NullBuffer::new(b.finish())).filter(|n| n.null_count() > 0)
}

/// Do these keys' bytes (row-encoded or column-hashed) tell a NULL column
/// from every value, so that the NULL-equal mode (INTERSECT / EXCEPT) may
/// compare rows with NULL key columns inside the keyed core? (Composite keys
/// that are neither exact nor one string / binary column.)
pub fn key_bytes_carry_nulls(types: &[DataType]) -> bool {
    !is_exact(types) && !is_byte_column(types)
}

/// Encode key columns given per batch (`batches[b][c]`: key column c of batch b;
/// all batches have the same types). `converter` must be shared by both sides of
/// an operator so their row bytes are comparable (row-encoded keys only). With `host_hashes == false`,
/// hash-encoded keys keep only their row bytes (the GPU backend hashes them on
/// the device; see [`KeyColumns::hashes_deferred`]).
pub fn encode(
    batches: &[Vec<ArrayRef>],
    types: &[DataType],
    converter: Option<&RowConverter>,
    host_hashes: bool,
) -> Result<KeyColumns> {
    let nulls = key_nulls(batches);
    if is_exact(types) {
        let chunks = crate::host::par_map(batches, 128, |cols| exact_values(&cols[0]))?;
        return Ok(KeyColumns { chunks, nulls, bytes: None });
    }
    if is_byte_column(types) {
        let mut column = ByteColumn::new(batches.iter().map(|cols| cols[0].clone()).collect())?;
        if !host_hashes {
            column.compact_bloated_views()?;
        }
        let chunks =
            if host_hashes { column.hash_arrays().into_iter().map(ScalarBuffer::from).collect() } else { Vec::new() };
        return Ok(KeyColumns { chunks, nulls, bytes: Some(KeyBytes::Values(column)) });
    }
    if is_column_hashed(types) {
        let mut columns = ColumnKeys::new(batches, types)?;
        if !host_hashes {
            columns.compact_bloated_views()?;
        }
        let chunks =
            if host_hashes { columns.hash_chunks().into_iter().map(ScalarBuffer::from).collect() } else { Vec::new() };
        return Ok(KeyColumns { chunks, nulls, bytes: Some(KeyBytes::Columns(columns)) });
    }
    let converter = converter.ok_or_else(|| DataFusionError::Internal("hash keys need a row converter".into()))?;
    let columns: Vec<ArrayRef> = (0..types.len())
        .map(|c| {
            let parts: Vec<&dyn Array> = batches.iter().map(|b| b[c].as_ref()).collect();
            if parts.is_empty() {
                Ok(datafusion::arrow::array::new_empty_array(&types[c]))
            } else {
                datafusion::arrow::compute::concat(&parts).map_err(DataFusionError::from)
            }
        })
        .collect::<Result<_>>()?;
    let normalized: Vec<ArrayRef> = columns.iter().map(normalize_floats).collect::<Result<_>>()?;
    let rows = converter.convert_columns(&normalized)?;
    let bytes = KeyBytes::Rows(rows);
    let chunks = if host_hashes { vec![ScalarBuffer::from(hash_rows(RowSubset::all(&bytes)))] } else { Vec::new() };
    Ok(KeyColumns { chunks, nulls, bytes: Some(bytes) })
}

/// Composite keys whose columns are each exact (integers, dates, decimals of
/// at most 18 digits, ...) and whose value ranges over both sides multiply to
/// at most 2^64 become one exact 64-bit key per row: column by column,
/// `key = key * range + (value - min)`, with one more slot per column for
/// NULL. Such keys need no row encoding, hashing or verification (TPC-H's
/// (partkey, suppkey) went from ~80 ns a row through row hashing to a few).
/// Returns None when the keys do not qualify. In the NULL-equal mode the
/// NULL slots make (NULL, 1) equal to (NULL, 1) only, as row encoding did.
pub fn encode_packed(
    a: &[Vec<ArrayRef>],
    b: &[Vec<ArrayRef>],
    types: &[DataType],
) -> Result<Option<(KeyColumns, KeyColumns)>> {
    if types.len() < 2 || !types.iter().all(|t| is_exact(std::slice::from_ref(t))) {
        return Ok(None);
    }
    let (ai, bi) = (column_images(a)?, column_images(b)?);
    let bounds = side_bounds(&[(&ai, a), (&bi, b)], types.len())?;
    let Some(domain) = PackedDomain::from_bounds(&bounds, 1u128 << 64) else { return Ok(None) };
    let pack = |side: &[Vec<ArrayRef>], imgs: &[Vec<ScalarBuffer<u64>>]| -> Result<KeyColumns> {
        let pairs: Vec<(&Vec<ScalarBuffer<u64>>, &Vec<ArrayRef>)> = imgs.iter().zip(side).collect();
        let chunks = crate::host::par_map(&pairs, 16, |(imgs, cols)| {
            Ok::<_, DataFusionError>(domain.pack_images(imgs, cols).into())
        })?;
        Ok(KeyColumns { chunks, nulls: key_nulls(side), bytes: None })
    };
    Ok(Some((pack(a, &ai)?, pack(b, &bi)?)))
}

/// Each batch's key columns as 64-bit images (reinterpreted as i64: injective per type).
fn column_images(side: &[Vec<ArrayRef>]) -> Result<Vec<Vec<ScalarBuffer<u64>>>> {
    crate::host::par_map(side, 16, |cols| cols.iter().map(exact_values).collect::<Result<Vec<_>>>())
}

/// (min, max) of each column's valid values over the sides' batches (images, columns).
fn side_bounds(
    sides: &[(&Vec<Vec<ScalarBuffer<u64>>>, &[Vec<ArrayRef>])],
    columns: usize,
) -> Result<Vec<Option<(i64, i64)>>> {
    let per_batch = |(imgs, cols): (&Vec<ScalarBuffer<u64>>, &Vec<ArrayRef>)| -> Vec<Option<(i64, i64)>> {
        imgs.iter()
            .zip(cols)
            .map(|(v, c)| {
                let span = |acc: (i64, i64), x: i64| (acc.0.min(x), acc.1.max(x));
                let empty = (i64::MAX, i64::MIN);
                let (lo, hi) = match c.logical_nulls().filter(|n| n.null_count() > 0) {
                    // Without NULLs a plain fold, which the compiler vectorizes.
                    None => v.iter().fold(empty, |acc, &x| span(acc, x as i64)),
                    Some(n) => n.valid_indices().fold(empty, |acc, i| span(acc, v[i] as i64)),
                };
                (lo <= hi).then_some((lo, hi))
            })
            .collect()
    };
    let pairs: Vec<(&Vec<ScalarBuffer<u64>>, &Vec<ArrayRef>)> =
        sides.iter().flat_map(|(imgs, cols)| imgs.iter().zip(cols.iter())).collect();
    let found = crate::host::par_map(&pairs, 16, |p| Ok::<_, DataFusionError>(per_batch(*p)))?;
    let mut bounds: Vec<Option<(i64, i64)>> = vec![None; columns];
    for batch in found {
        for (c, f) in batch.into_iter().enumerate() {
            if let Some((lo, hi)) = f {
                bounds[c] = Some(bounds[c].map_or((lo, hi), |(l, h)| (l.min(lo), h.max(hi))));
            }
        }
    }
    Ok(bounds)
}

/// The mixed-radix packing of exact key columns ([`encode_packed`]) over
/// per-column bounds: column c has `ranges[c]` slots, its values from
/// `mins[c]`, then one for NULL, and key = key * range + slot, column by
/// column. [`PackedDomain::of_side`] takes the bounds of one side alone (a
/// build side, before the other side is read): a value outside them packs to
/// [`PackedDomain::ABSENT`], which no key of the domain equals.
#[derive(Debug, Clone)]
pub struct PackedDomain {
    mins: Vec<i64>,
    ranges: Vec<u128>,
    size: u128,
}

impl PackedDomain {
    /// The key of a row with a value outside the domain (the domain of
    /// [`PackedDomain::of_side`] has fewer keys than 2^64 - 1, so none is this).
    pub const ABSENT: u64 = u64::MAX;

    /// Can keys of these types be packed from one side's bounds and stand
    /// for their rows? Integer-like exact columns only: floats are exact up
    /// to -0.0 = 0.0, where equal keys are not equal rows.
    pub fn packs(types: &[DataType]) -> bool {
        !types.is_empty()
            && types
                .iter()
                .all(|t| is_exact(std::slice::from_ref(t)) && !matches!(t, DataType::Float32 | DataType::Float64))
    }

    /// The domain of one side's key columns (`side[b][c]`: column c of batch
    /// b), of types [`PackedDomain::packs`] accepts; None when its keys would
    /// not fit below [`PackedDomain::ABSENT`].
    pub fn of_side(side: &[Vec<ArrayRef>], types: &[DataType]) -> Result<Option<Self>> {
        if !Self::packs(types) {
            return Ok(None);
        }
        let images = column_images(side)?;
        let bounds = side_bounds(&[(&images, side)], types.len())?;
        Ok(Self::from_bounds(&bounds, u64::MAX as u128))
    }

    /// The domain over per-column bounds (None: a column without values),
    /// when its keys number at most `limit`.
    fn from_bounds(bounds: &[Option<(i64, i64)>], limit: u128) -> Option<Self> {
        // Slots per column: its values, then NULL.
        let ranges: Vec<u128> =
            bounds.iter().map(|b| b.map_or(0, |(lo, hi)| (hi as i128 - lo as i128) as u128 + 1) + 1).collect();
        if !crate::util::mixed_radix_fits(ranges.iter().copied()) {
            return None;
        }
        let size: u128 = ranges.iter().product();
        let mins = bounds.iter().map(|b| b.map_or(0, |(lo, _)| lo)).collect();
        (size <= limit).then_some(PackedDomain { mins, ranges, size })
    }

    /// How many keys the domain has: its keys are `0..size`.
    pub fn size(&self) -> u128 {
        self.size
    }

    /// One batch's key columns packed (columns of the domain's types).
    pub fn pack(&self, cols: &[ArrayRef]) -> Result<Vec<u64>> {
        let images = cols.iter().map(exact_values).collect::<Result<Vec<_>>>()?;
        Ok(self.pack_images(&images, cols))
    }

    /// [`PackedDomain::pack`] over the columns' images.
    fn pack_images(&self, imgs: &[ScalarBuffer<u64>], cols: &[ArrayRef]) -> Vec<u64> {
        let n = cols.first().map_or(0, |c| c.len());
        // Written by the first column, not zeroed first (see `util::written_defaults`).
        let mut keys: Vec<u64> = Vec::new();
        for (c, (v, col)) in imgs.iter().zip(cols.iter()).enumerate() {
            // A column of 2^64 slots (the others then have one) wraps
            // `range` to 0, which is still exact as every key before
            // it is 0; its NULL slot is computed before the cast.
            let (range, null_slot, min) = (self.ranges[c] as u64, (self.ranges[c] - 1) as u64, self.mins[c]);
            let value_slot = |x: u64| (x as i64).wrapping_sub(min) as u64;
            // A value outside the bounds, or a key already absent, is absent. (A
            // partial key of the domain is ABSENT only where every later column
            // has one slot, the NULL one, which leaves the key as it is.)
            let step = |k: u64, slot: u64| {
                if slot >= null_slot || k == Self::ABSENT {
                    Self::ABSENT
                } else {
                    k.wrapping_mul(range).wrapping_add(slot)
                }
            };
            let null_step =
                |k: u64| if k == Self::ABSENT { Self::ABSENT } else { k.wrapping_mul(range).wrapping_add(null_slot) };
            let nulls = col.logical_nulls().filter(|n| n.null_count() > 0);
            match (c, nulls) {
                (0, None) => keys = v.iter().map(|&x| step(0, value_slot(x))).collect(),
                (0, Some(nb)) => {
                    keys = v
                        .iter()
                        .enumerate()
                        .map(|(i, &x)| if nb.is_null(i) { null_slot } else { step(0, value_slot(x)) })
                        .collect()
                }
                (_, None) => {
                    for (k, &x) in keys.iter_mut().zip(v.iter()) {
                        *k = step(*k, value_slot(x));
                    }
                }
                (_, Some(nb)) => {
                    for (i, (k, &x)) in keys.iter_mut().zip(v.iter()).enumerate() {
                        *k = if nb.is_null(i) { null_step(*k) } else { step(*k, value_slot(x)) };
                    }
                }
            }
        }
        keys.resize(n, 0);
        keys
    }
}

/// A row converter for these key types (None when the keys are exact, one
/// string / binary column, whose values are their own key bytes, or hashed
/// column by column: [`is_column_hashed`]).
pub fn converter_for(types: &[DataType]) -> Result<Option<RowConverter>> {
    if is_exact(types) || is_byte_column(types) || is_column_hashed(types) {
        return Ok(None);
    }
    let fields = types.iter().map(|t| SortField::new(normalized_type(t))).collect();
    Ok(Some(RowConverter::new(fields)?))
}

fn normalized_type(t: &DataType) -> DataType {
    t.clone()
}

/// A double's key: its bits, -0.0 made 0.0 (see the module's note on floats).
fn canon_f64(v: f64) -> u64 {
    if v == 0.0 {
        0
    } else {
        v.to_bits()
    }
}

fn canon_f32(v: f32) -> u64 {
    if v == 0.0 {
        0
    } else {
        v.to_bits() as u64
    }
}

/// Replace -0.0 by 0.0, so byte equality is DataFusion's equality.
fn normalize_floats(a: &ArrayRef) -> Result<ArrayRef> {
    Ok(match a.data_type() {
        DataType::Float64 => {
            Arc::new(a.as_primitive::<Float64Type>().unary::<_, Float64Type>(|v| f64::from_bits(canon_f64(v))))
        }
        DataType::Float32 => {
            Arc::new(a.as_primitive::<Float32Type>().unary::<_, Float32Type>(|v| f32::from_bits(canon_f32(v) as u32)))
        }
        _ => a.clone(),
    })
}

/// Is the key of a value of this type its own 64 bits? Then the key column
/// is the Arrow values buffer itself, and a key is also the column's value.
pub fn key_is_own_bits(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int64
            | DataType::UInt64
            | DataType::Date64
            | DataType::Timestamp(_, _)
            | DataType::Duration(_)
            | DataType::Time64(_)
    )
}

/// Exact 64-bit image of a single fixed-width column (NULL slots hold arbitrary values).
/// 64-bit integer columns share the Arrow buffer: no copy.
fn exact_values(a: &ArrayRef) -> Result<ScalarBuffer<u64>> {
    if key_is_own_bits(a.data_type()) {
        let data = a.to_data();
        return Ok(ScalarBuffer::new(data.buffers()[0].clone(), data.offset(), data.len()));
    }
    Ok(ScalarBuffer::from(exact_values_owned(a)?))
}

fn exact_values_owned(a: &ArrayRef) -> Result<Vec<u64>> {
    Ok(match a.data_type() {
        DataType::Float64 => a.as_primitive::<Float64Type>().values().iter().map(|v| canon_f64(*v)).collect(),
        DataType::Float32 => a.as_primitive::<Float32Type>().values().iter().map(|v| canon_f32(*v)).collect(),
        DataType::Int64 => a.as_primitive::<Int64Type>().values().iter().map(|v| *v as u64).collect(),
        DataType::UInt64 => a.as_primitive::<datafusion::arrow::datatypes::UInt64Type>().values().to_vec(),
        DataType::Boolean => {
            let b = a.as_boolean();
            (0..b.len()).map(|i| b.value(i) as u64).collect()
        }
        DataType::Decimal128(_, _) => a
            .as_primitive::<datafusion::arrow::datatypes::Decimal128Type>()
            .values()
            .iter()
            .map(|v| *v as i64 as u64)
            .collect(),
        _ => {
            // Every other exact type is an integer of at most 64 bits underneath.
            let data = a.to_data();
            let width = a.data_type().primitive_width().unwrap_or(8);
            let raw = datafusion::arrow::array::make_array(data.into_builder().data_type(int_of_width(width)).build()?);
            let as64 = cast(&raw, &DataType::Int64)?;
            let p: &PrimitiveArray<Int64Type> = as64.as_primitive();
            p.values().iter().map(|v| *v as u64).collect()
        }
    })
}

fn int_of_width(w: usize) -> DataType {
    match w {
        1 => DataType::Int8,
        2 => DataType::Int16,
        4 => DataType::Int32,
        _ => DataType::Int64,
    }
}

/// 64-bit hash of a byte string (the same function on every platform).
pub fn hash_bytes(b: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h: u64 = (b.len() as u64).wrapping_mul(K) ^ 0x243F_6A88_85A3_08D3;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_le_bytes(c.try_into().unwrap());
        h = (h ^ v).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    let r = chunks.remainder();
    tail[..r.len()].copy_from_slice(r);
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^= h >> 32;
    h = h.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    h ^ (h >> 32)
}

/// Start of [`hash_columns`]' chain (digits of pi, after `hash_bytes`' own).
pub const COLUMNS_SEED: u64 = 0x4528_21E6_38D0_1377;

/// One column's hash folded into a composite key's running hash (order
/// matters: (a, b) and (b, a) hash differently).
#[inline]
pub fn hash_columns_step(h: u64, column_hash: u64) -> u64 {
    (h ^ column_hash).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
}

/// The last step of [`hash_columns`]: the NULL mask's hash, then a final mix.
#[inline]
pub fn hash_columns_finish(h: u64, null_mask: u64) -> u64 {
    let mut h = hash_columns_step(h, hash_exact(null_mask));
    h ^= h >> 32;
    h = h.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    h ^ (h >> 32)
}

/// [`hash_bytes`] of an exact column's 64-bit image (its 8 little-endian bytes).
#[inline]
pub fn hash_exact(image: u64) -> u64 {
    hash_bytes(&image.to_le_bytes())
}

/// Hash of a column-hashed composite key ([`KeyBytes::Columns`]) from its
/// columns' hashes ([`hash_bytes`] of a string column's value, [`hash_exact`]
/// of an exact column's image) and its NULL mask (bit c: column c is NULL; 0
/// when no column is NULL, so a side without NULLs needs no mask):
/// `finish(step(... step(step(SEED, h0), h1) ..., hash_exact(mask)))`. The
/// device (kernels/row_hash.cu) computes the same, column by column.
pub fn hash_columns(column_hashes: impl IntoIterator<Item = u64>, null_mask: u64) -> u64 {
    hash_columns_finish(column_hashes.into_iter().fold(COLUMNS_SEED, hash_columns_step), null_mask)
}

/// The most key columns [`KeyBytes::Columns`] takes (one NULL-mask bit each).
pub const MAX_HASHED_COLUMNS: usize = 64;

/// Are these composite keys hashed column by column ([`KeyBytes::Columns`])?
/// Two or more columns (at most [`MAX_HASHED_COLUMNS`]), each exact on its
/// own ([`is_exact`]) or one string / binary column ([`is_byte_column`],
/// dictionaries of strings included: they are encoded as views, [`key_type`]).
pub fn is_column_hashed(types: &[DataType]) -> bool {
    (2..=MAX_HASHED_COLUMNS).contains(&types.len())
        && types.iter().all(|t| {
            let t = std::slice::from_ref(t);
            let k = [key_type(&t[0])];
            is_exact(t) || is_exact(&k) || is_byte_column(&k)
        })
}

/// Is this one string or binary column, whose values' bytes are its keys?
/// (Byte equality is SQL equality for these types.)
pub fn is_byte_column(types: &[DataType]) -> bool {
    use DataType::*;
    matches!(types, [Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView])
}

/// The exact bytes behind hash-encoded keys, one byte string per row.
pub enum KeyBytes {
    /// Arrow's row format: composite keys, wide decimals, fixed-size binary.
    Rows(Rows),
    /// One string / binary column as Arrow holds it (see [`is_byte_column`]).
    Values(ByteColumn),
    /// Composite keys of exact and string / binary columns, column by column
    /// (see [`is_column_hashed`]). A row's "bytes" ([`RowSubset::iter`]) are
    /// its Arrow row encoding, built only when asked for.
    Columns(ColumnKeys),
}

impl KeyBytes {
    pub fn len(&self) -> usize {
        match self {
            KeyBytes::Rows(r) => r.num_rows(),
            KeyBytes::Values(c) => c.len(),
            KeyBytes::Columns(c) => c.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One string / binary column over several batches, not copied.
pub struct ByteColumn {
    arrays: Vec<ArrayRef>,
    /// The first row of each array, then the total (`arrays.len() + 1` entries).
    starts: Vec<usize>,
}

impl ByteColumn {
    /// Every array must be a string or binary array ([`is_byte_column`]), all of one type.
    pub fn new(arrays: Vec<ArrayRef>) -> Result<Self> {
        let mut starts = Vec::with_capacity(arrays.len() + 1);
        starts.push(0);
        for a in &arrays {
            ByteParts::of(a.as_ref())?;
            if a.data_type() != arrays[0].data_type() {
                return Err(DataFusionError::Internal(format!(
                    "key column of {} and {}",
                    a.data_type(),
                    arrays[0].data_type()
                )));
            }
            starts.push(starts[starts.len() - 1] + a.len());
        }
        Ok(Self { arrays, starts })
    }
    pub fn len(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn arrays(&self) -> &[ArrayRef] {
        &self.arrays
    }
    /// The first row of each array, then the total.
    pub fn starts(&self) -> &[usize] {
        &self.starts
    }
    /// View arrays keep every buffer their rows came from: after a filter they
    /// may hold several times the bytes their rows use (TPC-H SF10 o_comment
    /// of half the orders: 800 MB of pages for 370 MB of values). Those are
    /// compacted (arrow's `gc`, array by array on the copy threads) so the
    /// device path uploads the used bytes only. Buffers shared by many arrays
    /// (views into a Parquet dictionary page) count once and stay as they are.
    pub fn compact_bloated_views(&mut self) -> Result<()> {
        fn views(a: &ArrayRef) -> Option<(usize, &[Buffer])> {
            match a.data_type() {
                DataType::Utf8View => {
                    Some((a.as_string_view().total_buffer_bytes_used(), a.as_string_view().data_buffers()))
                }
                DataType::BinaryView => {
                    Some((a.as_binary_view().total_buffer_bytes_used(), a.as_binary_view().data_buffers()))
                }
                _ => None,
            }
        }
        if self.arrays.first().and_then(views).is_none() {
            return Ok(());
        }
        let used: usize =
            crate::host::par_map(&self.arrays, 16, |a| Ok::<_, DataFusionError>(views(a).map_or(0, |v| v.0)))?
                .iter()
                .sum();
        let mut seen = std::collections::HashSet::new();
        let held: usize = self
            .arrays
            .iter()
            .filter_map(views)
            .flat_map(|(_, bufs)| bufs.iter())
            .filter(|b| seen.insert((b.as_ptr() as usize, b.len())))
            .map(|b| b.len())
            .sum();
        if held <= 2 * used + (64 << 20) {
            return Ok(());
        }
        self.arrays = crate::host::par_map(&self.arrays, 16, |a| {
            Ok::<ArrayRef, DataFusionError>(match a.data_type() {
                DataType::Utf8View => Arc::new(a.as_string_view().gc()),
                DataType::BinaryView => Arc::new(a.as_binary_view().gc()),
                _ => a.clone(),
            })
        })?;
        Ok(())
    }

    /// [`hash_bytes`] of every value, array by array on the copy threads.
    fn hash_arrays(&self) -> Vec<Vec<u64>> {
        let hashed = crate::host::par_map(&self.arrays, 16, |a| {
            let p = parts_of(a);
            Ok::<_, std::convert::Infallible>((0..p.len()).map(|i| hash_bytes(p.value(i))).collect())
        });
        match hashed {
            Ok(h) => h,
            Err(never) => match never {},
        }
    }

    /// Bytes of row `i` (`i < len()`).
    fn value(&self, i: usize) -> &[u8] {
        let b = self.starts.partition_point(|&s| s <= i) - 1;
        parts_of(&self.arrays[b]).value(i - self.starts[b])
    }
}

/// One key column of [`ColumnKeys`], as the hashing reads it.
pub enum KeyPart {
    /// An exact column: per batch, its 64-bit images (floats canonical, NULL slots 0).
    Exact(Vec<ScalarBuffer<u64>>),
    /// A string / binary column's values (NULL slots empty); always [`KeyBytes::Values`],
    /// so a [`RowSubset`] can read it like a one-column key.
    Bytes(KeyBytes),
}

/// The byte column inside [`KeyPart::Bytes`].
fn part_column(k: &KeyBytes) -> &ByteColumn {
    match k {
        KeyBytes::Values(c) => c,
        _ => unreachable!("KeyPart::Bytes holds KeyBytes::Values (ColumnKeys::new)"),
    }
}

/// Column-hashed composite keys over several batches ([`KeyBytes::Columns`]):
/// each key column in the form its hash and the device read (no row
/// encoding), plus each row's NULL mask where some key column holds a NULL.
/// NULL slots are canonical (0 / empty), so a NULL column's value never
/// decides a hash or a comparison; the mask tells NULL from 0 or ''.
pub struct ColumnKeys {
    parts: Vec<KeyPart>,
    /// Per batch, each row's NULL mask (bit c: key column c is NULL); None: no NULL anywhere.
    null_masks: Option<Vec<ScalarBuffer<u64>>>,
    /// The first row of each batch, then the total.
    starts: Vec<usize>,
    /// The key columns per batch as given, for the exact fallback's row encoding.
    arrays: Vec<Vec<ArrayRef>>,
    types: Vec<DataType>,
    /// Arrow's row encoding of every row, built on first use ([`ColumnKeys::rows`]).
    rows: std::sync::OnceLock<Rows>,
}

impl ColumnKeys {
    /// Key columns per batch (`batches[b][c]`) of the column-hashed `types`
    /// ([`is_column_hashed`]); columns not yet of their [`key_type`] are cast.
    pub fn new(batches: &[Vec<ArrayRef>], types: &[DataType]) -> Result<Self> {
        if !is_column_hashed(types) {
            return Err(DataFusionError::Internal(format!("keys of {types:?} are not hashed column by column")));
        }
        let types: Vec<DataType> = types.iter().map(key_type).collect();
        let arrays: Vec<Vec<ArrayRef>> = batches
            .iter()
            .map(|cols| {
                if cols.len() != types.len() || cols.iter().any(|c| c.len() != cols[0].len()) {
                    return Err(DataFusionError::Internal("composite key batch of the wrong shape".into()));
                }
                cols.iter()
                    .zip(&types)
                    .map(|(c, t)| if c.data_type() == t { Ok(c.clone()) } else { Ok(cast(c, t)?) })
                    .collect()
            })
            .collect::<Result<_>>()?;
        let mut starts = Vec::with_capacity(arrays.len() + 1);
        starts.push(0);
        for cols in &arrays {
            starts.push(starts[starts.len() - 1] + cols[0].len());
        }
        let parts = (0..types.len())
            .map(|c| {
                let column: Vec<ArrayRef> = arrays.iter().map(|cols| cols[c].clone()).collect();
                if is_exact(std::slice::from_ref(&types[c])) {
                    Ok(KeyPart::Exact(crate::host::par_map(&column, 16, exact_image)?))
                } else {
                    let column = crate::host::par_map(&column, 16, empty_null_slots)?;
                    Ok(KeyPart::Bytes(KeyBytes::Values(ByteColumn::new(column)?)))
                }
            })
            .collect::<Result<_>>()?;
        let null_masks = if arrays.iter().flatten().any(|a| a.logical_null_count() > 0) {
            Some(crate::host::par_map(&arrays, 16, |cols| {
                Ok::<_, DataFusionError>(ScalarBuffer::from(null_masks_of(cols)))
            })?)
        } else {
            None
        };
        Ok(Self { parts, null_masks, starts, arrays, types, rows: std::sync::OnceLock::new() })
    }
    pub fn len(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn parts(&self) -> &[KeyPart] {
        &self.parts
    }
    /// Per batch, each row's NULL mask; None when no key column holds a NULL.
    pub fn null_masks(&self) -> Option<&[ScalarBuffer<u64>]> {
        self.null_masks.as_deref()
    }
    /// The first row of each batch, then the total.
    pub fn starts(&self) -> &[usize] {
        &self.starts
    }
    /// The batch of row `i` and the row within it (`i < len()`).
    pub fn locate(&self, i: usize) -> (usize, usize) {
        let b = self.starts.partition_point(|&s| s <= i) - 1;
        (b, i - self.starts[b])
    }
    /// Row `i`'s NULL mask (0: no NULL column).
    pub fn null_mask(&self, i: usize) -> u64 {
        let (b, j) = self.locate(i);
        self.null_masks.as_ref().map_or(0, |m| m[b][j])
    }
    /// [`ByteColumn::compact_bloated_views`] on every string column.
    pub fn compact_bloated_views(&mut self) -> Result<()> {
        for p in &mut self.parts {
            if let KeyPart::Bytes(KeyBytes::Values(c)) = p {
                c.compact_bloated_views()?;
            }
        }
        Ok(())
    }

    /// [`hash_columns`] of every row, in row order, in pieces of at most 64K
    /// rows hashed column by column on the copy threads.
    pub fn hash_chunks(&self) -> Vec<Vec<u64>> {
        const PIECE: usize = 1 << 16;
        let pieces: Vec<(usize, usize, usize)> = (0..self.arrays.len())
            .flat_map(|b| {
                let n = self.starts[b + 1] - self.starts[b];
                (0..n).step_by(PIECE).map(move |lo| (b, lo, (lo + PIECE).min(n)))
            })
            .collect();
        let hashed = crate::host::par_map(&pieces, 2, |&(b, lo, hi)| {
            Ok::<_, std::convert::Infallible>(self.hash_range(b, lo, hi))
        });
        match hashed {
            Ok(h) => h,
            Err(never) => match never {},
        }
    }

    /// [`hash_columns`] of rows `lo..hi` of batch `b`: one pass per column over them.
    fn hash_range(&self, b: usize, lo: usize, hi: usize) -> Vec<u64> {
        let mut acc = vec![COLUMNS_SEED; hi - lo];
        for part in &self.parts {
            match part {
                KeyPart::Exact(images) => {
                    for (a, &v) in acc.iter_mut().zip(&images[b][lo..hi]) {
                        *a = hash_columns_step(*a, hash_exact(v));
                    }
                }
                KeyPart::Bytes(k) => {
                    let p = parts_of(&part_column(k).arrays[b]);
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a = hash_columns_step(*a, hash_bytes(p.value(lo + j)));
                    }
                }
            }
        }
        let masks = self.null_masks.as_ref().map(|m| &m[b][lo..hi]);
        for (j, a) in acc.iter_mut().enumerate() {
            *a = hash_columns_finish(*a, masks.map_or(0, |m| m[j]));
        }
        acc
    }

    /// Do row `i` here and row `j` of `other` (keys of the same types) hold
    /// the same tuple (NULL equal to NULL, never to a value)?
    pub fn rows_equal(&self, i: usize, other: &ColumnKeys, j: usize) -> bool {
        let ((bi, ri), (bj, rj)) = (self.locate(i), other.locate(j));
        let mask = |k: &ColumnKeys, b: usize, r: usize| k.null_masks.as_ref().map_or(0, |m| m[b][r]);
        self.parts.len() == other.parts.len()
            && mask(self, bi, ri) == mask(other, bj, rj)
            && self.parts.iter().zip(&other.parts).all(|(x, y)| match (x, y) {
                (KeyPart::Exact(x), KeyPart::Exact(y)) => x[bi][ri] == y[bj][rj],
                (KeyPart::Bytes(x), KeyPart::Bytes(y)) => {
                    parts_of(&part_column(x).arrays[bi]).value(ri) == parts_of(&part_column(y).arrays[bj]).value(rj)
                }
                _ => false,
            })
    }

    /// Arrow's row encoding of every row (floats normalised), built once on
    /// first use: only the exact fallback after a hash collision reads rows
    /// as byte strings. The types are those the row format encodes (checked
    /// by [`is_column_hashed`]), so encoding cannot fail.
    pub fn rows(&self) -> &Rows {
        self.rows.get_or_init(|| self.encode_rows().expect("arrow's row format encodes every column-hashed key type"))
    }

    fn encode_rows(&self) -> Result<Rows> {
        let columns: Vec<ArrayRef> = (0..self.types.len())
            .map(|c| {
                let parts: Vec<&dyn Array> = self.arrays.iter().map(|b| b[c].as_ref()).collect();
                if parts.is_empty() {
                    Ok(datafusion::arrow::array::new_empty_array(&self.types[c]))
                } else {
                    datafusion::arrow::compute::concat(&parts).map_err(DataFusionError::from)
                }
            })
            .collect::<Result<_>>()?;
        let normalized: Vec<ArrayRef> = columns.iter().map(normalize_floats).collect::<Result<_>>()?;
        let converter = RowConverter::new(self.types.iter().map(|t| SortField::new(t.clone())).collect())?;
        Ok(converter.convert_columns(&normalized)?)
    }
}

/// An exact column's 64-bit images with its NULL slots set to 0.
fn exact_image(a: &ArrayRef) -> Result<ScalarBuffer<u64>> {
    let values = exact_values(a)?;
    match a.logical_nulls() {
        Some(n) if n.null_count() > 0 => {
            let mut v = values.to_vec();
            for (x, valid) in v.iter_mut().zip(n.iter()) {
                if !valid {
                    *x = 0;
                }
            }
            Ok(ScalarBuffer::from(v))
        }
        _ => Ok(values),
    }
}

/// A string / binary array whose NULL slots are all empty (Arrow's builders
/// and kernels leave them so; other arrays are rebuilt).
fn empty_null_slots(a: &ArrayRef) -> Result<ArrayRef> {
    use datafusion::arrow::array::{
        BinaryArray, BinaryViewArray, LargeBinaryArray, LargeStringArray, StringArray, StringViewArray,
    };
    let Some(nulls) = a.logical_nulls().filter(|n| n.null_count() > 0) else { return Ok(a.clone()) };
    let p = ByteParts::of(a.as_ref())?;
    if (0..a.len()).all(|i| nulls.is_valid(i) || p.value_len(i) == 0) {
        return Ok(a.clone());
    }
    Ok(match a.data_type() {
        DataType::Utf8 => Arc::new(a.as_string::<i32>().iter().collect::<StringArray>()),
        DataType::LargeUtf8 => Arc::new(a.as_string::<i64>().iter().collect::<LargeStringArray>()),
        DataType::Utf8View => Arc::new(a.as_string_view().iter().collect::<StringViewArray>()),
        DataType::Binary => Arc::new(a.as_binary::<i32>().iter().collect::<BinaryArray>()),
        DataType::LargeBinary => Arc::new(a.as_binary::<i64>().iter().collect::<LargeBinaryArray>()),
        DataType::BinaryView => Arc::new(a.as_binary_view().iter().collect::<BinaryViewArray>()),
        t => return Err(DataFusionError::Internal(format!("{t} is not a string or binary column"))),
    })
}

/// Each row's NULL mask over one batch's key columns (bit c: column c is NULL).
fn null_masks_of(cols: &[ArrayRef]) -> Vec<u64> {
    let mut masks = vec![0u64; cols.first().map_or(0, |c| c.len())];
    for (c, col) in cols.iter().enumerate() {
        if let Some(n) = col.logical_nulls() {
            for (m, valid) in masks.iter_mut().zip(n.iter()) {
                *m |= (!valid as u64) << c;
            }
        }
    }
    masks
}

/// A string / binary array's buffers, read without a type dispatch per row.
#[derive(Clone, Copy)]
pub enum ByteParts<'a> {
    /// Utf8 / Binary: value `i` is `data[offsets[i]..offsets[i + 1]]`.
    Offsets32(&'a [i32], &'a [u8]),
    /// LargeUtf8 / LargeBinary.
    Offsets64(&'a [i64], &'a [u8]),
    /// Utf8View / BinaryView: 16-byte views (little-endian length, then 12
    /// inline bytes, or a 4-byte prefix, buffer index and offset) and the buffers.
    Views(&'a [u8], &'a [Buffer]),
}

impl<'a> ByteParts<'a> {
    pub fn of(a: &'a dyn Array) -> Result<Self> {
        use DataType::*;
        Ok(match a.data_type() {
            Utf8 => ByteParts::Offsets32(a.as_string::<i32>().value_offsets(), a.as_string::<i32>().value_data()),
            Binary => ByteParts::Offsets32(a.as_binary::<i32>().value_offsets(), a.as_binary::<i32>().value_data()),
            LargeUtf8 => ByteParts::Offsets64(a.as_string::<i64>().value_offsets(), a.as_string::<i64>().value_data()),
            LargeBinary => {
                ByteParts::Offsets64(a.as_binary::<i64>().value_offsets(), a.as_binary::<i64>().value_data())
            }
            Utf8View => {
                ByteParts::Views(a.as_string_view().views().inner().as_slice(), a.as_string_view().data_buffers())
            }
            BinaryView => {
                ByteParts::Views(a.as_binary_view().views().inner().as_slice(), a.as_binary_view().data_buffers())
            }
            t => return Err(DataFusionError::Internal(format!("{t} is not a string or binary column"))),
        })
    }
    pub fn len(&self) -> usize {
        match self {
            ByteParts::Offsets32(o, _) => o.len() - 1,
            ByteParts::Offsets64(o, _) => o.len() - 1,
            ByteParts::Views(v, _) => v.len() / 16,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Length of value `i` (`i < len()`), without reading its bytes.
    #[inline]
    pub fn value_len(&self, i: usize) -> usize {
        match *self {
            ByteParts::Offsets32(o, _) => (o[i + 1] - o[i]) as usize,
            ByteParts::Offsets64(o, _) => (o[i + 1] - o[i]) as usize,
            ByteParts::Views(v, _) => u32::from_le_bytes(v[16 * i..16 * i + 4].try_into().unwrap()) as usize,
        }
    }
    /// Bytes of value `i` (`i < len()`; NULL slots give whatever they hold).
    #[inline]
    pub fn value(&self, i: usize) -> &'a [u8] {
        match *self {
            ByteParts::Offsets32(o, d) => &d[o[i] as usize..o[i + 1] as usize],
            ByteParts::Offsets64(o, d) => &d[o[i] as usize..o[i + 1] as usize],
            ByteParts::Views(v, bufs) => {
                let view = &v[16 * i..16 * i + 16];
                let word = |k: usize| u32::from_le_bytes(view[k..k + 4].try_into().unwrap()) as usize;
                let len = word(0);
                if len <= 12 {
                    &view[4..4 + len]
                } else {
                    &bufs[word(8)].as_slice()[word(12)..word(12) + len]
                }
            }
        }
    }
}

/// [`ByteParts::of`] for arrays [`ByteColumn::new`] already checked.
fn parts_of(a: &ArrayRef) -> ByteParts<'_> {
    ByteParts::of(a.as_ref()).expect("checked by ByteColumn::new")
}

/// Some rows of [`KeyBytes`]: all of them, or those at `idx` (e.g. the non-NULL
/// keys), in that order. Lets verification and the device read a subset
/// without copying it.
#[derive(Clone, Copy)]
pub struct RowSubset<'a> {
    bytes: &'a KeyBytes,
    idx: Option<&'a [u32]>,
}

impl<'a> RowSubset<'a> {
    pub fn all(bytes: &'a KeyBytes) -> Self {
        Self { bytes, idx: None }
    }
    /// `idx` must index the rows (checked once here, so reads never panic later).
    pub fn new(bytes: &'a KeyBytes, idx: Option<&'a [u32]>) -> Result<Self> {
        if let Some(ix) = idx {
            if ix.iter().any(|&i| i as usize >= bytes.len()) {
                return Err(DataFusionError::Internal("row subset index out of range".into()));
            }
        }
        Ok(Self { bytes, idx })
    }
    pub fn len(&self) -> usize {
        self.idx.map_or(self.bytes.len(), |ix| ix.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn bytes(&self) -> &'a KeyBytes {
        self.bytes
    }
    pub fn idx(&self) -> Option<&'a [u32]> {
        self.idx
    }
    /// Every row's bytes, in order (arrays are walked in turn, not searched, when all rows are read).
    pub fn iter(self) -> Box<dyn Iterator<Item = &'a [u8]> + 'a> {
        match (self.bytes, self.idx) {
            (KeyBytes::Rows(r), None) => Box::new(r.iter().map(|r| r.data())),
            (KeyBytes::Rows(r), Some(ix)) => Box::new(ix.iter().map(move |&i| r.row(i as usize).data())),
            (KeyBytes::Values(c), None) => Box::new(c.arrays.iter().flat_map(|a| {
                let p = parts_of(a);
                (0..p.len()).map(move |i| p.value(i))
            })),
            (KeyBytes::Values(c), Some(ix)) => Box::new(ix.iter().map(move |&i| c.value(i as usize))),
            // Row-encoded on first use (the rare exact fallback); hashing and verification read the columns.
            (KeyBytes::Columns(c), None) => Box::new(c.rows().iter().map(|r| r.data())),
            (KeyBytes::Columns(c), Some(ix)) => {
                let rows = c.rows();
                Box::new(ix.iter().map(move |&i| rows.row(i as usize).data()))
            }
        }
    }
    /// The row of the underlying keys that is the subset's `j`-th.
    #[inline]
    pub fn row_index(&self, j: usize) -> usize {
        self.idx.map_or(j, |ix| ix[j] as usize)
    }
    /// Total bytes of the subset's rows.
    pub fn data_len(&self) -> usize {
        match (self.bytes, self.idx) {
            (KeyBytes::Rows(r), None) => r.lengths().sum(),
            (KeyBytes::Rows(r), Some(ix)) => ix.iter().map(|&i| r.row_len(i as usize)).sum(),
            _ => self.iter().map(|r| r.len()).sum(),
        }
    }
}

/// Host hashes of rows ([`hash_bytes`] of each row's bytes); a whole string
/// column is hashed array by array on several threads.
pub fn hash_rows(rows: RowSubset<'_>) -> Vec<u64> {
    if let (KeyBytes::Values(c), None) = (rows.bytes, rows.idx) {
        return c.hash_arrays().concat();
    }
    if let KeyBytes::Columns(c) = rows.bytes {
        // Column by column on all cores; a subset (the non-NULL rows) reads from all rows' hashes.
        let all = c.hash_chunks().concat();
        return match rows.idx {
            None => all,
            Some(ix) => ix.iter().map(|&i| all[i as usize]).collect(),
        };
    }
    rows.iter().map(hash_bytes).collect()
}

/// Column-hashed keys ([`KeyBytes::Columns`]) on both sides: do equal hashes
/// always mean equal tuples? Each row is compared, column by column and on
/// its NULL mask, with the first row (build rows first) that has its hash;
/// no row is encoded. `false` (a collision) also when the subsets are not
/// column-hashed keys of the same shape, or the hashes do not fit them.
pub fn verify_columns(build: RowSubset<'_>, build_hashes: &[u64], probe: RowSubset<'_>, probe_hashes: &[u64]) -> bool {
    let (KeyBytes::Columns(bc), KeyBytes::Columns(pc)) = (build.bytes, probe.bytes) else { return false };
    if build_hashes.len() != build.len() || probe_hashes.len() != probe.len() {
        return false;
    }
    let mut rep: HashMap<u64, (bool, usize)> = HashMap::with_capacity(build.len() + probe.len());
    for (is_probe, rows, hashes, keys) in [(false, build, build_hashes, bc), (true, probe, probe_hashes, pc)] {
        for (j, &h) in hashes.iter().enumerate() {
            let i = rows.row_index(j);
            let (rep_probe, r) = *rep.entry(h).or_insert((is_probe, i));
            if (rep_probe, r) != (is_probe, i) && !keys.rows_equal(i, if rep_probe { pc } else { bc }, r) {
                return false;
            }
        }
    }
    true
}

/// For hash-encoded keys: check that equal hashes always mean equal rows
/// across both sides. Returns `None` if the hashes are collision-free (the
/// device result stands), or exact dense ids for both sides if a collision
/// was found (the caller recomputes with them). Deferred hashes are computed here.
pub fn verify_or_exact(build: &KeyColumns, probe: &KeyColumns) -> Option<(Vec<u64>, Vec<u64>)> {
    let (Some(br), Some(pr)) = (&build.bytes, &probe.bytes) else { return None };
    let hashes =
        |k: &KeyColumns, r| if k.hashes_deferred() { hash_rows(RowSubset::all(r)) } else { k.iter().collect() };
    let (bh, ph) = (hashes(build, br), hashes(probe, pr));
    verify_rows_or_exact(RowSubset::all(br), &bh, RowSubset::all(pr), &ph)
}

/// [`verify_or_exact`] over row subsets and their hashes (`hashes[j]` is the hash of row `j`).
pub fn verify_rows_or_exact<'a>(
    build: RowSubset<'a>,
    build_hashes: &[u64],
    probe: RowSubset<'a>,
    probe_hashes: &[u64],
) -> Option<(Vec<u64>, Vec<u64>)> {
    if let (KeyBytes::Columns(_), KeyBytes::Columns(_)) = (build.bytes, probe.bytes) {
        return (!verify_columns(build, build_hashes, probe, probe_hashes)).then(|| exact_ids(build, probe));
    }
    let mut rep: HashMap<u64, &'a [u8]> = HashMap::with_capacity(build.len() + probe.len());
    let mut collision = build_hashes.len() != build.len() || probe_hashes.len() != probe.len();
    'outer: for (rows, hashes) in [(build, build_hashes), (probe, probe_hashes)] {
        if collision {
            break;
        }
        for (&k, r) in hashes.iter().zip(rows.iter()) {
            if *rep.entry(k).or_insert(r) != r {
                collision = true;
                break 'outer;
            }
        }
    }
    collision.then(|| exact_ids(build, probe))
}

/// Exact dense ids of both sides' rows: equal ids iff equal row bytes.
pub fn exact_ids<'a>(build: RowSubset<'a>, probe: RowSubset<'a>) -> (Vec<u64>, Vec<u64>) {
    let mut ids: HashMap<&'a [u8], u64> = HashMap::with_capacity(build.len() + probe.len());
    let mut id_of = |r: &'a [u8]| {
        let n = ids.len() as u64;
        *ids.entry(r).or_insert(n)
    };
    let b = build.iter().map(&mut id_of).collect();
    let p = probe.iter().map(&mut id_of).collect();
    (b, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Date32Array, Int32Array, Int64Array, StringArray};
    use rand::{Rng, SeedableRng};

    /// A domain from one side's bounds: equal tuples (NULLs equal to NULLs)
    /// pack to equal keys below its size, different ones to different keys,
    /// and a tuple with a value outside the side's bounds to ABSENT.
    #[test]
    fn one_sides_domain_packs_the_others_keys() {
        let types = [DataType::Int32, DataType::Int64];
        let col32 = |v: &[Option<i32>]| -> ArrayRef { Arc::new(Int32Array::from(v.to_vec())) };
        let col64 = |v: &[Option<i64>]| -> ArrayRef { Arc::new(Int64Array::from(v.to_vec())) };
        let build = vec![
            vec![col32(&[Some(-5), Some(7), None]), col64(&[Some(1 << 40), Some(3), Some(9)])],
            vec![col32(&[Some(0)]), col64(&[None])],
        ];
        let domain = PackedDomain::of_side(&build, &types).unwrap().expect("small ranges fit");
        // Column 0: -5..=7 and NULL (14 slots); column 1: 3..=2^40 and NULL.
        assert_eq!(domain.size(), 14 * ((1u128 << 40) - 3 + 2));
        let probe_a = [Some(-5), Some(7), None, Some(0), Some(8), Some(-6), Some(1), None];
        let probe_b = [Some(1 << 40), Some(3), Some(9), None, Some(3), Some(3), Some(2), None];
        let keys = domain.pack(&[col32(&probe_a), col64(&probe_b)]).unwrap();
        let built: Vec<u64> = build.iter().flat_map(|b| domain.pack(b).unwrap()).collect();
        assert_eq!(keys[..4], built[..], "the build side's own tuples");
        // 8 and -6 lie outside column 0's bounds, 2 outside column 1's.
        assert_eq!(keys[4..7], [PackedDomain::ABSENT; 3]);
        assert!(keys[7] < domain.size() as u64 && !built.contains(&keys[7]));
        let distinct: std::collections::HashSet<u64> = keys[..4].iter().chain(&keys[7..]).copied().collect();
        assert_eq!(distinct.len(), 5);
        // Floats are exact only up to -0.0 = 0.0; wide ranges do not fit below ABSENT.
        assert!(!PackedDomain::packs(&[DataType::Float64]) && PackedDomain::packs(&[DataType::Date32]));
        let wide = vec![vec![col64(&[Some(i64::MIN), Some(i64::MAX)])]];
        assert!(PackedDomain::of_side(&wide, &[DataType::Int64]).unwrap().is_none());
    }

    /// Filtered views that keep a large buffer for few rows are compacted
    /// (same values, small buffers); views sharing one buffer are left alone.
    #[test]
    fn bloated_views_are_compacted() {
        use datafusion::arrow::array::{BooleanArray, StringViewArray};
        let long: Vec<String> = (0..1_000_000).map(|i| format!("{i:0>100}")).collect();
        let all: ArrayRef = Arc::new(StringViewArray::from_iter_values(long.iter()));
        let keep = BooleanArray::from((0..all.len()).map(|i| i % 100 == 0).collect::<Vec<_>>());
        let few = datafusion::arrow::compute::filter(&all, &keep).unwrap();
        let buffers = |c: &ByteColumn| -> usize {
            c.arrays().iter().flat_map(|a| a.as_string_view().data_buffers()).map(|b| b.len()).sum()
        };
        let mut col = ByteColumn::new(vec![few.clone(), few.slice(0, 10)]).unwrap();
        let before: Vec<Vec<u8>> = RowSubset::all(&KeyBytes::Values(ByteColumn::new(col.arrays().to_vec()).unwrap()))
            .iter()
            .map(|r| r.to_vec())
            .collect();
        assert!(buffers(&col) > 100_000_000);
        col.compact_bloated_views().unwrap();
        assert!(buffers(&col) < 2_000_000, "{}", buffers(&col));
        let after: Vec<Vec<u8>> = RowSubset::all(&KeyBytes::Values(col)).iter().map(|r| r.to_vec()).collect();
        assert_eq!(before, after);
        // Every row of the buffer in use, across slices sharing it: kept as it is.
        let mut shared = ByteColumn::new(vec![all.slice(0, 500_000), all.slice(500_000, 500_000)]).unwrap();
        shared.compact_bloated_views().unwrap();
        assert!(std::ptr::eq(
            shared.arrays()[0].as_string_view().data_buffers()[0].as_ptr(),
            all.as_string_view().data_buffers()[0].as_ptr()
        ));
    }

    /// Packed keys are equal exactly when the rows are (NULL equal to NULL,
    /// column by column), across batches and both sides.
    #[test]
    fn packed_composite_keys_are_exact() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let batch = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<ArrayRef> {
            let a: Int64Array =
                (0..n).map(|_| rng.random_bool(0.9).then(|| rng.random_range(-5..5i64) * 1_000_000_007)).collect();
            let b: Int32Array =
                (0..n).map(|_| rng.random_bool(0.9).then(|| rng.random_range(i32::MIN..=i32::MIN + 3))).collect();
            let c: Date32Array = (0..n).map(|_| rng.random_bool(0.95).then(|| rng.random_range(0..4))).collect();
            vec![Arc::new(a), Arc::new(b), Arc::new(c)]
        };
        let left: Vec<Vec<ArrayRef>> = (0..3).map(|i| batch(&mut rng, 50 + i * 40)).collect();
        let right: Vec<Vec<ArrayRef>> = (0..2).map(|i| batch(&mut rng, 70 + i)).collect();
        let types = [DataType::Int64, DataType::Int32, DataType::Date32];
        let (lk, rk) = encode_packed(&left, &right, &types).unwrap().expect("ranges fit in 64 bits");
        // The rows as strings ("NULL" for NULL), in the same order as the keys.
        let show = |side: &[Vec<ArrayRef>]| -> Vec<String> {
            side.iter()
                .flat_map(|cols| {
                    (0..cols[0].len())
                        .map(|i| {
                            cols.iter()
                                .map(|c| {
                                    datafusion::arrow::util::display::array_value_to_string(c, i).unwrap_or_default()
                                })
                                .map(|v| if v.is_empty() { "NULL".into() } else { v })
                                .collect::<Vec<String>>()
                                .join("|")
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let rows: Vec<String> = show(&left).into_iter().chain(show(&right)).collect();
        let keys: Vec<u64> = lk.iter().chain(rk.iter()).collect();
        assert_eq!(rows.len(), keys.len());
        let mut pairs = 0;
        for i in 0..rows.len() {
            for j in 0..rows.len() {
                assert_eq!(rows[i] == rows[j], keys[i] == keys[j], "{} vs {}", rows[i], rows[j]);
                pairs += (rows[i] == rows[j]) as usize;
            }
        }
        assert!(pairs > rows.len(), "the data must repeat rows");
        // Any NULL column marks the row NULL (for the joins' NULL rules).
        assert!(lk.null_count() > 0);
        // Strings, or ranges past 64 bits, do not qualify.
        let s: Vec<Vec<ArrayRef>> =
            vec![vec![Arc::new(StringArray::from(vec!["a"])), Arc::new(Int64Array::from(vec![1]))]];
        assert!(encode_packed(&s, &s, &[DataType::Utf8, DataType::Int64]).unwrap().is_none());
        let wide: Vec<Vec<ArrayRef>> =
            vec![vec![Arc::new(Int64Array::from(vec![i64::MIN, i64::MAX])), Arc::new(Int64Array::from(vec![0, 1]))]];
        assert!(encode_packed(&wide, &wide, &[DataType::Int64, DataType::Int64]).unwrap().is_none());
        // Slots (values and NULL) multiplying to exactly 2^64 still fit, as on the device
        // (gpu::packs_in_64_bits): the extreme rows get the keys 0 and 2^64 - 2 - 2^32.
        let edge = (1i64 << 32) - 2;
        let full: Vec<Vec<ArrayRef>> =
            vec![vec![Arc::new(Int64Array::from(vec![0, edge])), Arc::new(Int64Array::from(vec![0, edge]))]];
        let (fk, _) = encode_packed(&full, &full, &[DataType::Int64, DataType::Int64]).unwrap().expect("2^64 fits");
        assert_eq!(fk.iter().collect::<Vec<_>>(), vec![0, u64::MAX - (1 << 32) - 1]);
        assert!(crate::util::mixed_radix_fits([1u128 << 32, 1 << 32]));
        assert!(!crate::util::mixed_radix_fits([1u128 << 32, (1 << 32) + 1]));
        assert!(!crate::util::mixed_radix_fits([5u128, 0]));
    }
    /// A composite key's rows as strings ("NULL" for NULL; floats through
    /// their canonical bits), in row order over the batches: equal strings
    /// iff equal tuples under the NULL-equal rules.
    fn show_rows(side: &[Vec<ArrayRef>]) -> Vec<String> {
        side.iter()
            .flat_map(|cols| {
                (0..cols.first().map_or(0, |c| c.len()))
                    .map(|i| {
                        cols.iter()
                            .map(|c| {
                                if c.is_null(i) {
                                    return "NULL".to_string();
                                }
                                match c.data_type() {
                                    DataType::Float64 => {
                                        format!("f{:x}", canon_f64(c.as_primitive::<Float64Type>().value(i)))
                                    }
                                    _ => format!(
                                        "<{}>",
                                        datafusion::arrow::util::display::array_value_to_string(c, i).unwrap()
                                    ),
                                }
                            })
                            .collect::<Vec<String>>()
                            .join("|")
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn column_keys(side: &[Vec<ArrayRef>], types: &[DataType]) -> (KeyColumns, Vec<u64>) {
        let k = encode(side, types, None, true).unwrap();
        assert!(matches!(k.bytes, Some(KeyBytes::Columns(_))));
        let hashes: Vec<u64> = k.iter().collect();
        (k, hashes)
    }

    fn columns_of(k: &KeyColumns) -> &ColumnKeys {
        match &k.bytes {
            Some(KeyBytes::Columns(c)) => c,
            _ => panic!("column-hashed keys expected"),
        }
    }

    /// Pins the composite hash the device reproduces (values from an
    /// independent port of hash_bytes and hash_columns:
    /// `scripts/golden-hashes.py` prints them), through encoding:
    /// NULL slots hash as 0 / '' plus the NULL mask, -0.0 as 0.0, -NaN as its bits.
    #[test]
    fn column_hash_golden_values() {
        use datafusion::arrow::array::{Float64Array, StringViewArray};
        assert_eq!(hash_exact(1), 0x11ca40ce59ce8990);
        assert_eq!(hash_columns([hash_bytes(b"a"), hash_exact(1)], 0), 0x5640cbca1445d4c3);
        let s: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None, Some(""), Some("a"), Some("a"), Some("a")]));
        let i: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), Some(1), Some(1), None, Some(0), Some(-1)]));
        let (k, h) = column_keys(&[vec![s, i]], &[DataType::Utf8, DataType::Int64]);
        let want = [
            0x5640cbca1445d4c3u64,
            0x1b0a4baa8e2a0477,
            0x5c61c1f57f6541c9,
            0xc6034eaafb3d0e8e,
            0xbb1bb84713c8635f,
            0x44ea6b500f42b0ae,
        ];
        assert_eq!(h, want);
        assert_eq!(hash_rows(RowSubset::all(k.bytes.as_ref().unwrap())), want);
        let d: ArrayRef = Arc::new(Date32Array::from(vec![Some(19000), Some(19000), None]));
        let v: ArrayRef =
            Arc::new(StringViewArray::from(vec![Some("setfusion row hash!"), Some("setfusion row hash!"), None]));
        let f: ArrayRef = Arc::new(Float64Array::from(vec![Some(-0.0), Some(-f64::NAN), None]));
        let (_, h) = column_keys(&[vec![d, v, f]], &[DataType::Date32, DataType::Utf8View, DataType::Float64]);
        assert_eq!(h, [0x6f44c8487907018d, 0xbe5cb42a3eb97ad7, 0xeaddebfa10d06d10]);
    }

    /// A float column's keys are equal exactly where DataFusion's `=` holds:
    /// -0.0 = 0.0; NaNs equal bit for bit ('NaN' is not the NaN with the sign
    /// bit, which x86 gives for 0.0 / 0.0).
    #[test]
    fn float_keys_are_datafusions_equality() {
        use datafusion::arrow::array::{Float32Array, Float64Array};
        let payload = f64::from_bits(f64::NAN.to_bits() | 1);
        let v = [0.0, -0.0, f64::NAN, -f64::NAN, payload, 1.5, f64::INFINITY];
        let equal = |x: f64, y: f64| x == y || x.to_bits() == y.to_bits();
        let a: ArrayRef = Arc::new(Float64Array::from(v.to_vec()));
        let k = exact_values_owned(&a).unwrap();
        let a32: ArrayRef = Arc::new(Float32Array::from(v.iter().map(|&x| x as f32).collect::<Vec<_>>()));
        let k32 = exact_values_owned(&a32).unwrap();
        for i in 0..v.len() {
            for j in 0..v.len() {
                assert_eq!(k[i] == k[j], equal(v[i], v[j]), "{:?} {:?}", v[i], v[j]);
                let (x, y) = (v[i] as f32, v[j] as f32);
                assert_eq!(k32[i] == k32[j], x == y || x.to_bits() == y.to_bits(), "{x:?} {y:?}");
            }
        }
    }

    #[test]
    fn column_hashed_key_types() {
        use DataType::*;
        let dict = Dictionary(Box::new(Int32), Box::new(Utf8));
        for t in [
            vec![Utf8, Int64],
            vec![Int32, LargeUtf8, Date32],
            vec![Utf8View, dict.clone()],
            vec![LargeUtf8, Float64],
            vec![Int64, Int64],
        ] {
            assert!(is_column_hashed(&t), "{t:?}");
            assert!(key_bytes_carry_nulls(&t));
            assert!(converter_for(&t).unwrap().is_none(), "{t:?}");
        }
        for t in
            [vec![Utf8], vec![Int64], vec![Utf8, Decimal128(38, 2)], vec![FixedSizeBinary(4), Int32], vec![Utf8, Null]]
        {
            assert!(!is_column_hashed(&t), "{t:?}");
        }
        assert!(converter_for(&[Utf8, Decimal128(38, 2)]).unwrap().is_some());
        assert!(!is_column_hashed(&vec![Int8; MAX_HASHED_COLUMNS + 1]));
        // The GPU backend defers the hashing to the device.
        let b = vec![vec![
            Arc::new(StringArray::from(vec!["a"])) as ArrayRef,
            Arc::new(Int32Array::from(vec![1])) as ArrayRef,
        ]];
        let k = encode(&b, &[Utf8, Int32], None, false).unwrap();
        assert!(k.hashes_deferred() && k.len() == 1);
    }

    /// Random composites of strings (every string type, dictionaries), ints,
    /// dates and floats (-0.0, NaNs), with NULLs in every column, garbage
    /// under some NULLs and sliced batches: equal hashes iff equal tuples
    /// (NULL equal to NULL only), column-wise verification passes, forced
    /// collisions are caught and resolved by exact ids.
    #[test]
    fn column_hashed_keys_are_exact() {
        use datafusion::arrow::array::{Float64Array, StringViewArray};
        use DataType::*;
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let words = ["", "a", "b", "twelve bytes", "thirteen byte", "a much longer string of bytes"];
        let floats = [0.0, -0.0, f64::NAN, -f64::NAN, 1.5];
        let dict = Dictionary(Box::new(Int32), Box::new(Utf8));
        let column = |rng: &mut rand::rngs::StdRng, t: &DataType, n: usize| -> ArrayRef {
            let a: ArrayRef = match t {
                Float64 => Arc::new(
                    (0..n + 2)
                        .map(|_| rng.random_bool(0.85).then(|| floats[rng.random_range(0..floats.len())]))
                        .collect::<Float64Array>(),
                ),
                Int32 | Int64 | Date32 => {
                    // Garbage under the NULLs: the values buffer keeps numbers there.
                    let v: Vec<i64> = (0..n + 2).map(|_| rng.random_range(-2..3)).collect();
                    let nulls = NullBuffer::from((0..n + 2).map(|_| rng.random_bool(0.85)).collect::<Vec<bool>>());
                    cast(&(Arc::new(Int64Array::new(v.into(), Some(nulls))) as ArrayRef), t).unwrap()
                }
                _ => {
                    // Garbage under the NULLs of offset arrays: non-empty values there.
                    let v: Vec<&str> = (0..n + 2).map(|_| words[rng.random_range(0..words.len())]).collect();
                    let nulls = NullBuffer::from((0..n + 2).map(|_| rng.random_bool(0.85)).collect::<Vec<bool>>());
                    let full = StringArray::from(v);
                    let s = StringArray::new(full.offsets().clone(), full.values().clone(), Some(nulls));
                    match t {
                        Utf8View => Arc::new(StringViewArray::from_iter(s.iter())),
                        _ => cast(&(Arc::new(s) as ArrayRef), t).unwrap(),
                    }
                }
            };
            a.slice(1, n)
        };
        for types in [vec![Utf8, Int32], vec![Int64, Utf8, Date32], vec![Utf8View, dict], vec![LargeUtf8, Float64]] {
            let key_types: Vec<DataType> = types.iter().map(key_type).collect();
            let mut side = |sizes: &[usize]| -> Vec<Vec<ArrayRef>> {
                sizes.iter().map(|&n| types.iter().map(|t| column(&mut rng, t, n)).collect()).collect()
            };
            let (left, right) = (side(&[40, 0, 90]), side(&[70, 13]));
            let (lk, lh) = column_keys(&left, &key_types);
            let (rk, rh) = column_keys(&right, &key_types);
            let rows: Vec<String> = show_rows(&left).into_iter().chain(show_rows(&right)).collect();
            let hashes: Vec<u64> = lh.iter().chain(&rh).copied().collect();
            let (lc, rc) = (columns_of(&lk), columns_of(&rk));
            let at = |g: usize| if g < lc.len() { (lc, g) } else { (rc, g - lc.len()) };
            let mut pairs = 0;
            for i in 0..rows.len() {
                for j in 0..rows.len() {
                    let same = rows[i] == rows[j];
                    assert_eq!(same, hashes[i] == hashes[j], "{types:?}: {} vs {}", rows[i], rows[j]);
                    let ((a, x), (b, y)) = (at(i), at(j));
                    assert_eq!(same, a.rows_equal(x, b, y), "{types:?}: {} vs {}", rows[i], rows[j]);
                    pairs += same as usize;
                }
            }
            assert!(pairs > rows.len() && lk.null_count() > 0, "{types:?}: the data must repeat rows and hold NULLs");
            let (lb, rb) = (lk.bytes.as_ref().unwrap(), rk.bytes.as_ref().unwrap());
            let (ls, rs) = (RowSubset::all(lb), RowSubset::all(rb));
            assert!(verify_columns(ls, &lh, rs, &rh));
            assert!(verify_rows_or_exact(ls, &lh, rs, &rh).is_none());
            // Exact ids (from lazily built Arrow rows) group like the tuples.
            let (li, ri) = exact_ids(ls, rs);
            let ids: Vec<u64> = li.iter().chain(&ri).copied().collect();
            for i in 0..rows.len() {
                for j in 0..rows.len() {
                    assert_eq!(
                        rows[i] == rows[j],
                        ids[i] == ids[j],
                        "{types:?}: exact ids of {} and {}",
                        rows[i],
                        rows[j]
                    );
                }
            }
            // Two different tuples forced onto one hash (one on each side): caught, resolved exactly.
            let j = (0..rh.len()).find(|&j| rows[lh.len() + j] != rows[0]).unwrap();
            let mut forced = rh.clone();
            forced[j] = lh[0];
            assert!(!verify_columns(ls, &lh, rs, &forced));
            assert_eq!(verify_rows_or_exact(ls, &lh, rs, &forced), Some((li.clone(), ri.clone())));
            // Subsets (the rows without NULLs) hash and verify the same way.
            let valid =
                |k: &KeyColumns| -> Vec<u32> { (0..k.len() as u32).filter(|&i| !k.is_null(i as usize)).collect() };
            let (lv, rv) = (valid(&lk), valid(&rk));
            let (lsub, rsub) = (RowSubset::new(lb, Some(&lv)).unwrap(), RowSubset::new(rb, Some(&rv)).unwrap());
            let (lsh, rsh) = (hash_rows(lsub), hash_rows(rsub));
            assert_eq!(lsh, lv.iter().map(|&i| lh[i as usize]).collect::<Vec<_>>());
            assert!(verify_columns(lsub, &lsh, rsub, &rsh));
            let (lsi, rsi) = exact_ids(lsub, rsub);
            assert_eq!(lsi.len(), lv.len());
            assert_eq!(rsi.len(), rv.len());
            // The wrong number of hashes is never taken as collision-free.
            assert!(!verify_columns(ls, &lh[1..], rs, &rh));
        }
    }

    /// In the NULL-equal mode (NULL, 'a') equals (NULL, 'a') only: never
    /// ('', 'a'), (0, 'a'), ('a', NULL) or (NULL, NULL), whatever the NULL slots hold.
    #[test]
    fn null_masks_tell_null_from_values() {
        let strings = |v: Vec<Option<&str>>| -> ArrayRef { Arc::new(StringArray::from(v)) };
        // Column 0 a string: rows (NULL, a) twice (garbage "x" under the second NULL), ('', a), (a, NULL), (NULL, NULL).
        let full = StringArray::from(vec!["", "x", "", "a", ""]);
        let first = StringArray::new(
            full.offsets().clone(),
            full.values().clone(),
            Some(NullBuffer::from(vec![false, false, true, true, false])),
        );
        let b = vec![vec![Arc::new(first) as ArrayRef, strings(vec![Some("a"), Some("a"), Some("a"), None, None])]];
        let (k, h) = column_keys(&b, &[DataType::Utf8, DataType::Utf8]);
        let c = columns_of(&k);
        assert_eq!(h[0], h[1]);
        assert!(c.rows_equal(0, c, 1));
        for j in 2..5 {
            assert_ne!(h[0], h[j], "row {j}");
            assert!(!c.rows_equal(0, c, j));
        }
        assert_eq!((c.null_mask(0), c.null_mask(2), c.null_mask(3), c.null_mask(4)), (1, 0, 2, 3));
        // Column 0 an integer: (NULL, a) with 7 under the NULL, (NULL, a), (0, a).
        let ints = Int64Array::new(vec![7i64, 0, 0].into(), Some(NullBuffer::from(vec![false, false, true])));
        let b = vec![vec![Arc::new(ints) as ArrayRef, strings(vec![Some("a"), Some("a"), Some("a")])]];
        let (k, h) = column_keys(&b, &[DataType::Int64, DataType::Utf8]);
        assert_eq!(h[0], h[1]);
        assert_ne!(h[0], h[2]);
        assert!(!columns_of(&k).rows_equal(0, columns_of(&k), 2));
        // A side without NULLs hashes its rows as a side with NULLs does.
        let (_, plain) = column_keys(
            &[vec![Arc::new(Int64Array::from(vec![0])) as ArrayRef, strings(vec![Some("a")])]],
            &[DataType::Int64, DataType::Utf8],
        );
        assert_eq!(plain[0], h[2]);
    }
}
