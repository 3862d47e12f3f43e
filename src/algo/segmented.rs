//! The segmented list plumbing both list families run on (issue 15), the
//! launcher of kernels/segmented.cu: a batch's two list arguments on the
//! device as one key array per side cut into rows by offsets
//! ([`DeviceListPair`], [`DeviceSide`]: upload as the keys' u64 image,
//! segment ids, the order check, a segmented device sort), scans, work items
//! numbered row after row ([`RowItems`]) and count-then-fill
//! ([`count_then_fill`]). Both `set_*`'s Balanced Path
//! ([`crate::algo::multiset`]) and `sorted_intersect`'s GTWJ
//! ([`crate::algo::sorted_intersect`]) import it; it imports neither, so the
//! two families' launchers do not import each other (issue 29).

use std::fmt::Debug;
use std::sync::Arc;

use cudarc::driver::{LaunchArgs, LaunchConfig, PushKernelArg};
use datafusion::arrow::array::{ArrayRef, AsArray, ListArray, PrimitiveArray};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, UInt64Type};
use datafusion::error::{DataFusionError, Result};

use crate::algo::radix_sort;
use crate::gpu::{cuda_err, DeviceBuffer, Gpu, Pod, TransferStats};

/// kernels/segmented.cu, with the longest row `ms_row_sort` sorts as `-D`
/// (its scan tile is its own).
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "segmented",
    source: include_str!("../../kernels/segmented.cu"),
    defines: segmented_defines,
};

/// The longest row the block-per-row sort takes (`MS_ROW_SORT_MAX`): 2,048
/// keys are 16 KiB of shared memory, and the list functions' rows are
/// mostly far shorter.
pub const ROW_SORT_MAX: usize = 2048;

fn segmented_defines() -> Vec<(String, u64)> {
    vec![("MS_ROW_SORT_MAX".into(), ROW_SORT_MAX as u64)]
}

/// An integer element type of the list functions: i64 (signed and mixed
/// integer lists) or u64 (unsigned). Device keys are its order-preserving
/// u64 image `bits ^ FLIP`.
pub trait ListKey: Pod + Ord + Debug {
    /// XOR with the bits that maps the type's order onto u64's.
    const FLIP: u64;
    /// The Arrow type list values are cast to, and the result's element type.
    fn data_type() -> DataType;
    /// The values of an array of [`ListKey::data_type`].
    fn values(array: &ArrayRef) -> &[Self];
    /// A List array from its parts.
    fn list(offsets: Vec<i32>, values: Vec<Self>, nulls: Option<NullBuffer>) -> Result<ArrayRef>;
    /// The value whose key image is `image` (`bits ^ FLIP` back).
    fn from_image(image: u64) -> Self;
}

macro_rules! list_key {
    ($t:ty, $arrow:ty, $dt:ident, $flip:expr) => {
        impl ListKey for $t {
            const FLIP: u64 = $flip;
            fn data_type() -> DataType {
                DataType::$dt
            }
            fn values(array: &ArrayRef) -> &[Self] {
                array.as_primitive::<$arrow>().values()
            }
            fn list(offsets: Vec<i32>, values: Vec<Self>, nulls: Option<NullBuffer>) -> Result<ArrayRef> {
                let field = Arc::new(Field::new_list_field(DataType::$dt, true));
                let values = Arc::new(PrimitiveArray::<$arrow>::new(ScalarBuffer::from(values), None));
                let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
                Ok(Arc::new(ListArray::try_new(field, offsets, values, nulls)?))
            }
            fn from_image(image: u64) -> Self {
                (image ^ $flip) as $t
            }
        }
    };
}

list_key!(i64, Int64Type, Int64, 1u64 << 63);
list_key!(u64, UInt64Type, UInt64, 0);

pub(crate) fn launch_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> DataFusionError + '_ {
    move |e| cuda_err(what, e)
}

/// Exclusive scan of `input[0, n)` into a new buffer of n + 1 entries (the last one the total).
pub(crate) fn exclusive_scan(gpu: &Gpu, input: &DeviceBuffer<u32>, n: usize) -> Result<DeviceBuffer<u32>> {
    const TILE: usize = 256 * 8; // MS_SCAN_TILE
    let ntiles = n.div_ceil(TILE).max(1);
    let out = gpu.alloc::<u32>(n + 1)?;
    let sums = gpu.alloc::<u32>(ntiles + 1)?;
    let (n64, nt32) = (n as u64, ntiles as u32);
    let stream = gpu.stream();
    let tiles = LaunchConfig { grid_dim: (nt32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let f = gpu.function(&KERNEL, "ms_scan_reduce")?;
    // SAFETY: signature matches kernels/segmented.cu; input holds n entries, sums ntiles + 1.
    unsafe { stream.launch_builder(&f).arg(&input.slice).arg(&n64).arg(&sums.slice).launch(tiles) }
        .map_err(launch_err("ms_scan_reduce"))?;
    let f = gpu.function(&KERNEL, "ms_scan_sums")?;
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: one block scans sums[0, ntiles) in place and writes sums[ntiles].
    unsafe { stream.launch_builder(&f).arg(&sums.slice).arg(&nt32).launch(one) }.map_err(launch_err("ms_scan_sums"))?;
    let f = gpu.function(&KERNEL, "ms_scan_tiles")?;
    // SAFETY: input holds n entries, out n + 1, sums ntiles + 1.
    unsafe {
        stream.launch_builder(&f).arg(&input.slice).arg(&n64).arg(&sums.slice).arg(&nt32).arg(&out.slice).launch(tiles)
    }
    .map_err(launch_err("ms_scan_tiles"))?;
    Ok(out)
}

/// The id of the segment of each of the `n` items that `offsets` (rows + 1
/// entries, ending at n) cuts into rows: item j of [offsets[r], offsets[r + 1]) gets r.
fn segment_ids(gpu: &Gpu, offsets: &DeviceBuffer<u32>, rows: usize, n: usize) -> Result<DeviceBuffer<u32>> {
    let seg = gpu.alloc::<u32>(n)?;
    if n > 0 {
        let f = gpu.function(&KERNEL, "ms_seg_ids")?;
        let rows32 = rows as u32;
        // SAFETY: offsets hold rows + 1 entries ending at n; seg holds n entries.
        unsafe {
            gpu.stream()
                .launch_builder(&f)
                .arg(&offsets.slice)
                .arg(&rows32)
                .arg(&seg.slice)
                .launch(gpu.grid_stride(rows * 32, 32))
        }
        .map_err(launch_err("ms_seg_ids"))?;
    }
    Ok(seg)
}

/// The result's row offsets (rows + 1 entries): row r starts at
/// `scanned[first[r]]`, where `scanned` is the exclusive scan of per-item
/// output counts and `first` (rows + 1 entries) the rows' first items.
fn row_starts(
    gpu: &Gpu,
    scanned: &DeviceBuffer<u32>,
    first: &DeviceBuffer<u32>,
    rows: usize,
) -> Result<DeviceBuffer<u32>> {
    let out = gpu.alloc::<u32>(rows + 1)?;
    let f = gpu.function(&KERNEL, "ms_gather_u32")?;
    let n32 = (rows + 1) as u32;
    // SAFETY: first holds rows + 1 indices into scanned (each <= its item count); out rows + 1 entries.
    unsafe {
        gpu.stream()
            .launch_builder(&f)
            .arg(&scanned.slice)
            .arg(&first.slice)
            .arg(&n32)
            .arg(&out.slice)
            .launch(gpu.grid_stride(rows + 1, 32))
    }
    .map_err(launch_err("ms_gather_u32"))?;
    Ok(out)
}

/// A segmented result on the device: row offsets (rows + 1) and values,
/// whose buffer holds `bound` entries (the host's upper bound of the total,
/// so no count is read back before the fill).
pub(crate) struct SegmentedResult<T> {
    pub(crate) offsets: DeviceBuffer<u32>,
    pub(crate) values: DeviceBuffer<T>,
    pub(crate) bound: usize,
}

impl<T: ListKey> SegmentedResult<T> {
    /// The result's row offsets, then its values: two downloads, the first
    /// of which gives the second its length.
    pub(crate) fn download(&self, gpu: &Gpu, rows: usize, stats: &mut TransferStats) -> Result<(Vec<u32>, Vec<T>)> {
        let offsets = gpu.download(&self.offsets, rows + 1, stats)?;
        let total = offsets[rows] as usize;
        if total > self.bound {
            return Err(DataFusionError::Internal(format!(
                "list function: {total} result elements over the bound of {}",
                self.bound
            )));
        }
        if total > i32::MAX as usize {
            return Err(DataFusionError::Execution(
                "list function: the result batch holds more than 2^31 - 1 elements".into(),
            ));
        }
        Ok((offsets, gpu.download(&self.values, total, stats)?))
    }
}

/// Work items (Balanced Path tiles, GTWJ sequences) numbered row after row:
/// row r's are [offsets[r], offsets[r + 1]); `rows_of` gives each item's row.
pub(crate) struct RowItems {
    pub(crate) offsets: DeviceBuffer<u32>,
    pub(crate) rows_of: DeviceBuffer<u32>,
    pub(crate) n: usize,
}

impl RowItems {
    /// Items numbered by `offsets` (rows + 1 entries, ending at `n`), known on the host.
    pub(crate) fn from_offsets(gpu: &Gpu, offsets: DeviceBuffer<u32>, rows: usize, n: usize) -> Result<Self> {
        let rows_of = segment_ids(gpu, &offsets, rows, n)?;
        Ok(Self { offsets, rows_of, n })
    }

    /// `counts[r]` items for each of the `rows` rows.
    pub(crate) fn from_counts(
        gpu: &Gpu,
        counts: &DeviceBuffer<u32>,
        rows: usize,
        stats: &mut TransferStats,
    ) -> Result<Self> {
        let offsets = exclusive_scan(gpu, counts, rows)?;
        let n = gpu.read_one(&offsets, rows, stats)? as usize;
        let rows_of = segment_ids(gpu, &offsets, rows, n)?;
        Ok(Self { offsets, rows_of, n })
    }
}

/// One pass of a count-then-fill kernel, as its last four arguments
/// (`u32* cnt, const u32* excl, u64 flip, u64* out`): count each item's
/// outputs into `Count`, or write them at `Fill`'s scanned starts.
pub(crate) enum Pass<'a, T> {
    Count(&'a DeviceBuffer<u32>),
    Fill(&'a DeviceBuffer<u32>, &'a DeviceBuffer<T>),
}

impl<'a, T> Pass<'a, T> {
    /// Push the four arguments (`null` stands for a null pointer).
    pub(crate) fn push<'l>(&self, l: &mut LaunchArgs<'l>, null: &'l u64, flip: &'l u64)
    where
        'a: 'l,
    {
        match *self {
            Pass::Count(counts) => l.arg(&counts.slice).arg(null).arg(flip).arg(null),
            Pass::Fill(starts, values) => l.arg(null).arg(&starts.slice).arg(flip).arg(&values.slice),
        };
    }
}

/// Count-then-fill over `items`: `walk(Pass::Count)` counts each item's
/// outputs, a scan gives each item's (and so each row's) first output, and
/// `walk(Pass::Fill)` writes them into a result of `bound` entries (at least
/// the total, which the host knows from the rows' lengths; nothing is read
/// back in between).
pub(crate) fn count_then_fill<T: ListKey>(
    gpu: &Gpu,
    items: &RowItems,
    rows: usize,
    bound: usize,
    walk: impl Fn(Pass<'_, T>) -> Result<()>,
) -> Result<SegmentedResult<T>> {
    let counts = gpu.alloc::<u32>(items.n)?;
    walk(Pass::Count(&counts))?;
    let starts = exclusive_scan(gpu, &counts, items.n)?;
    let offsets = row_starts(gpu, &starts, &items.offsets, rows)?;
    let values = gpu.alloc::<T>(bound)?;
    walk(Pass::Fill(&starts, &values))?;
    Ok(SegmentedResult { offsets, values, bound })
}

/// Both list arguments of a batch on the device, with the rows' validity.
pub(crate) struct DeviceListPair {
    pub(crate) a: DeviceSide,
    pub(crate) b: DeviceSide,
    /// One byte per row: 0 when the row's result is NULL (its elements are ignored).
    pub(crate) valid: DeviceBuffer<u8>,
    pub(crate) rows: usize,
}

impl DeviceListPair {
    /// Push both sides' keys and row offsets (`a, aoff, b, boff`), the first
    /// arguments of the segmented kernels.
    pub(crate) fn push_sides<'l>(&'l self, l: &mut LaunchArgs<'l>) {
        l.arg(&self.a.keys.slice).arg(&self.a.offsets.slice).arg(&self.b.keys.slice).arg(&self.b.offsets.slice);
    }

    /// Per row, the marked elements of both sides: `ea` and `eb` are the
    /// exclusive scans (n + 1 entries) of per-element marks of sides a and b.
    pub(crate) fn row_counts(
        &self,
        gpu: &Gpu,
        ea: &DeviceBuffer<u32>,
        eb: &DeviceBuffer<u32>,
    ) -> Result<DeviceBuffer<u32>> {
        let counts = gpu.alloc::<u32>(self.rows)?;
        let f = gpu.function(&KERNEL, "ms_row_counts")?;
        let rows32 = self.rows as u32;
        // SAFETY: offsets hold rows + 1 entries into the scans (n + 1 entries each); counts holds rows.
        unsafe {
            gpu.stream()
                .launch_builder(&f)
                .arg(&self.a.offsets.slice)
                .arg(&ea.slice)
                .arg(&self.b.offsets.slice)
                .arg(&eb.slice)
                .arg(&rows32)
                .arg(&counts.slice)
                .launch(gpu.grid_stride(self.rows, 32))
        }
        .map_err(launch_err("ms_row_counts"))?;
        Ok(counts)
    }
}

/// Bits needed for ids 0..count.
fn id_bits(count: usize) -> u32 {
    if count <= 1 {
        0
    } else {
        usize::BITS - (count - 1).leading_zeros()
    }
}

/// A side's values sent in their own Arrow bytes (a raw batch,
/// [`crate::algo::list_pack`]), made into u64 key images on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawImages {
    /// Integers of `width` bytes (1, 2, 4 or 8), sign-extended when `signed`
    /// (`ms_images`).
    Ints { width: usize, signed: bool },
    /// Strings of at most 7 bytes as their inline keys (`ms_inline_keys`):
    /// `n + 1` u32 offsets from 0 at byte `offsets_at`, then `bytes` bytes of
    /// string data where the values go.
    Strings { offsets_at: usize, bytes: usize },
    /// Utf8View views (16 bytes each) of strings of at most 7 bytes, as their
    /// inline keys (`ms_view_keys`).
    Views,
}

impl RawImages {
    /// Bytes of `n` values where the values go (the strings' data for `Strings`).
    pub fn value_bytes(self, n: usize) -> usize {
        match self {
            RawImages::Ints { width, .. } => n * width,
            RawImages::Strings { bytes, .. } => bytes,
            RawImages::Views => n * 16,
        }
    }

    /// The CPU twin of the image kernels: the key images (`^ flip`) of `n`
    /// values whose bytes are `values` (and, for strings, whose u32 offsets
    /// are `offsets`).
    pub fn images_cpu(self, values: &[u8], offsets: &[u8], n: usize, flip: u64) -> Vec<u64> {
        let word = |b: &[u8], w: usize, i: usize| -> u64 {
            let mut x = [0u8; 8];
            x[..w].copy_from_slice(&b[w * i..w * i + w]);
            u64::from_le_bytes(x)
        };
        (0..n)
            .map(|i| {
                let image = match self {
                    RawImages::Ints { width, signed } => {
                        let v = word(values, width, i);
                        let shift = 64 - 8 * width as u32;
                        if signed && shift > 0 {
                            (((v << shift) as i64) >> shift) as u64
                        } else {
                            v
                        }
                    }
                    RawImages::Strings { .. } => {
                        let (s, e) = (word(offsets, 4, i) as usize, word(offsets, 4, i + 1) as usize);
                        crate::keys::inline_key(&values[s..e])
                    }
                    RawImages::Views => {
                        let view = u128::from_le_bytes(values[16 * i..16 * i + 16].try_into().unwrap_or([0; 16]));
                        crate::keys::inline_key_of_view(view)
                    }
                };
                image ^ flip
            })
            .collect()
    }
}

/// A side's values as they reached the device, before they are key images.
pub(crate) enum SideValues {
    /// 32-bit offsets from the batch's smallest image.
    Narrow(DeviceBuffer<u32>),
    /// Whole u64 images.
    Wide(DeviceBuffer<u64>),
    /// Raw integers: bytes, width, signed.
    Ints(DeviceBuffer<u8>, usize, bool),
    /// Raw strings: u32 offsets from 0 (n + 1), bytes.
    Strings(DeviceBuffer<u32>, DeviceBuffer<u8>),
    /// Raw Utf8View views (two u64 words each).
    Views(DeviceBuffer<u64>),
}

impl SideValues {
    /// Queue the kernel that writes the `n` (> 0) values' key images into
    /// `keys`: widened over `base`, or made from the raw values (`^ flip`).
    /// Whole images need none.
    fn launch_images(&self, gpu: &Gpu, n: usize, base: u64, flip: u64, keys: &DeviceBuffer<u64>) -> Result<()> {
        let n64 = n as u64;
        let grid = gpu.grid_stride(n, 32);
        let stream = gpu.stream();
        let (name, launched) = match self {
            SideValues::Wide(_) => return Ok(()),
            SideValues::Narrow(narrow) => {
                let f = gpu.function(&KERNEL, "ms_widen")?;
                // SAFETY: signature matches kernels/segmented.cu; narrow and keys hold n entries.
                ("ms_widen", unsafe {
                    stream.launch_builder(&f).arg(&narrow.slice).arg(&n64).arg(&base).arg(&keys.slice).launch(grid)
                })
            }
            SideValues::Ints(v, width, signed) => {
                let f = gpu.function(&KERNEL, "ms_images")?;
                let (w, sg) = (*width as u32, *signed as u32);
                // SAFETY: signature matches; v holds n values of `width` bytes, keys n entries.
                ("ms_images", unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(&v.slice)
                        .arg(&n64)
                        .arg(&w)
                        .arg(&sg)
                        .arg(&flip)
                        .arg(&keys.slice)
                        .launch(grid)
                })
            }
            SideValues::Strings(o, d) => {
                let f = gpu.function(&KERNEL, "ms_inline_keys")?;
                // SAFETY: signature matches; o holds n + 1 offsets within d's bytes, keys n entries.
                ("ms_inline_keys", unsafe {
                    stream
                        .launch_builder(&f)
                        .arg(&o.slice)
                        .arg(&d.slice)
                        .arg(&n64)
                        .arg(&flip)
                        .arg(&keys.slice)
                        .launch(grid)
                })
            }
            SideValues::Views(v) => {
                let f = gpu.function(&KERNEL, "ms_view_keys")?;
                // SAFETY: signature matches; v holds n 16-byte views, keys n entries.
                ("ms_view_keys", unsafe {
                    stream.launch_builder(&f).arg(&v.slice).arg(&n64).arg(&flip).arg(&keys.slice).launch(grid)
                })
            }
        };
        launched.map(|_| ()).map_err(launch_err(name))
    }
}

/// How a side's values travel in its batch's loan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SideForm {
    /// Packed keys: whole u64 images when `wide`, else 32-bit offsets.
    Packed { wide: bool },
    /// The values' own bytes.
    Raw(RawImages),
}

/// One side of a packed batch on the device (or on its way there): row
/// offsets and values, copied from the batch's pinned loan.
pub(crate) struct SideParts {
    pub(crate) offsets: DeviceBuffer<u32>,
    pub(crate) values: SideValues,
}

impl SideParts {
    /// Queue the side's copies on `stream`: `rows + 1` u32 offsets at byte
    /// `offsets_at` of `loan`, and at `values_at` its `n` values in `form`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn upload(
        gpu: &Gpu,
        stream: &Arc<cudarc::driver::CudaStream>,
        loan: &mut crate::gpu::PinnedLoan,
        (offsets_at, values_at): (usize, usize),
        rows: usize,
        n: usize,
        form: SideForm,
        stats: &mut TransferStats,
    ) -> Result<Self> {
        let offsets = gpu.upload_loaned_on::<u32>(stream, loan, offsets_at, rows + 1, stats)?;
        let values = match form {
            SideForm::Packed { wide: true } => {
                SideValues::Wide(gpu.upload_loaned_on(stream, loan, values_at, n, stats)?)
            }
            SideForm::Packed { wide: false } => {
                SideValues::Narrow(gpu.upload_loaned_on(stream, loan, values_at, n, stats)?)
            }
            SideForm::Raw(RawImages::Ints { width, signed }) => {
                SideValues::Ints(gpu.upload_loaned_on(stream, loan, values_at, n * width, stats)?, width, signed)
            }
            SideForm::Raw(RawImages::Strings { offsets_at: so, bytes }) => SideValues::Strings(
                gpu.upload_loaned_on(stream, loan, so, n + 1, stats)?,
                gpu.upload_loaned_on(stream, loan, values_at, bytes, stats)?,
            ),
            SideForm::Raw(RawImages::Views) => {
                SideValues::Views(gpu.upload_loaned_on(stream, loan, values_at, 2 * n, stats)?)
            }
        };
        Ok(Self { offsets, values })
    }
}

/// One side on the device: u64 keys, offsets (rows + 1), segment id per element.
pub(crate) struct DeviceSide {
    pub(crate) keys: DeviceBuffer<u64>,
    pub(crate) offsets: DeviceBuffer<u32>,
    pub(crate) seg: DeviceBuffer<u32>,
    pub(crate) n: usize,
}

impl DeviceSide {
    /// One side from its parts on the device ([`SideParts`]): `n` key images
    /// made from the packed keys (widened from 32-bit offsets over `base`, or
    /// taken as they are) or from the raw values (`^ flip`), and a segment id
    /// per element.
    pub(crate) fn from_parts(gpu: &Gpu, parts: SideParts, n: usize, rows: usize, base: u64, flip: u64) -> Result<Self> {
        let SideParts { offsets, values } = parts;
        let keys = match values {
            SideValues::Wide(keys) => keys,
            other => {
                let keys = gpu.alloc::<u64>(n)?;
                if n > 0 {
                    other.launch_images(gpu, n, base, flip, &keys)?;
                }
                keys
            }
        };
        let seg = segment_ids(gpu, &offsets, rows, n)?;
        Ok(Self { keys, offsets, seg, n })
    }

    /// Sort every segment on the device, its keys' images lying in [min, max]
    /// and no row longer than `longest` (both known on the host, so nothing is
    /// read back): one block per row in shared memory when every row fits
    /// ([`ROW_SORT_MAX`]), else a radix sort of composite keys.
    pub(crate) fn sort_segments(
        &mut self,
        gpu: &Gpu,
        rows: usize,
        (min, max): (u64, u64),
        longest: usize,
    ) -> Result<()> {
        let n = self.n;
        let stream = gpu.stream();
        let n64 = n as u64;
        if longest <= ROW_SORT_MAX {
            let f = gpu.function(&KERNEL, "ms_row_sort")?;
            let rows32 = rows as u32;
            let blocks = rows.clamp(1, 65_535) as u32;
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: signature matches kernels/segmented.cu; keys hold n entries, offsets rows + 1 ending at n,
            // and no row is longer than MS_ROW_SORT_MAX (checked above).
            unsafe {
                stream.launch_builder(&f).arg(&self.keys.slice).arg(&self.offsets.slice).arg(&rows32).launch(cfg)
            }
            .map_err(launch_err("ms_row_sort"))?;
            return Ok(());
        }
        let range = max.saturating_sub(min);
        let kbits = 64 - range.leading_zeros();
        let sbits = id_bits(rows);
        let compose = gpu.function(&KERNEL, "ms_compose")?;
        let null: u64 = 0;
        if kbits + sbits <= 64 {
            // One sort of (segment << kbits | key - min).
            let mut comp = gpu.alloc::<u64>(n)?;
            // SAFETY: keys, seg and comp hold n entries.
            unsafe {
                stream
                    .launch_builder(&compose)
                    .arg(&self.keys.slice)
                    .arg(&self.seg.slice)
                    .arg(&n64)
                    .arg(&min)
                    .arg(&kbits)
                    .arg(&comp.slice)
                    .launch(gpu.grid_stride(n, 32))
            }
            .map_err(launch_err("ms_compose"))?;
            radix_sort::sort_keys_u64(gpu, &mut comp, n, 0, kbits + sbits)?;
            let f = gpu.function(&KERNEL, "ms_split")?;
            // SAFETY: comp and keys hold n entries.
            unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&comp.slice)
                    .arg(&n64)
                    .arg(&min)
                    .arg(&kbits)
                    .arg(&self.keys.slice)
                    .launch(gpu.grid_stride(n, 32))
            }
            .map_err(launch_err("ms_split"))?;
        } else {
            // Wide keys: a stable sort by key, then a stable sort by segment, of the positions.
            let mut k = gpu.alloc::<u64>(n)?;
            let mut idx = gpu.alloc::<u32>(n)?;
            // SAFETY: keys and k hold n entries; a null seg pointer composes the key alone.
            unsafe {
                stream
                    .launch_builder(&compose)
                    .arg(&self.keys.slice)
                    .arg(&null)
                    .arg(&n64)
                    .arg(&min)
                    .arg(&kbits)
                    .arg(&k.slice)
                    .launch(gpu.grid_stride(n, 32))
            }
            .map_err(launch_err("ms_compose"))?;
            let f = gpu.function(&KERNEL, "ms_iota")?;
            // SAFETY: idx holds n entries.
            unsafe { stream.launch_builder(&f).arg(&idx.slice).arg(&n64).launch(gpu.grid_stride(n, 32)) }
                .map_err(launch_err("ms_iota"))?;
            radix_sort::sort_pairs_u64(gpu, &mut k, &mut idx, n, 0, kbits)?;
            drop(k);
            let mut segk = gpu.alloc::<u32>(n)?;
            let f = gpu.function(&KERNEL, "ms_gather_seg")?;
            // SAFETY: idx, seg and segk hold n entries; idx is a permutation of 0..n.
            unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&idx.slice)
                    .arg(&self.seg.slice)
                    .arg(&n64)
                    .arg(&segk.slice)
                    .launch(gpu.grid_stride(n, 32))
            }
            .map_err(launch_err("ms_gather_seg"))?;
            radix_sort::sort_pairs_u32(gpu, &mut segk, &mut idx, n, 0, sbits)?;
            let sorted = gpu.alloc::<u64>(n)?;
            let f = gpu.function(&KERNEL, "ms_gather_keys")?;
            // SAFETY: keys, idx and sorted hold n entries.
            unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&self.keys.slice)
                    .arg(&idx.slice)
                    .arg(&n64)
                    .arg(&sorted.slice)
                    .launch(gpu.grid_stride(n, 32))
            }
            .map_err(launch_err("ms_gather_keys"))?;
            self.keys = sorted;
        }
        Ok(())
    }
}
