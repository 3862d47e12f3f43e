//! Small helpers every layer may use: the trace timeline and one-line errors.

use datafusion::error::DataFusionError;

/// With SETFUSION_TRACE set, print one timeline event to stderr (ms since
/// the first event of the process): where a query's time goes between its
/// operators and the runtime, which per-operator metrics cannot show.
pub fn trace(what: &str) {
    static EPOCH: std::sync::OnceLock<Option<std::time::Instant>> = std::sync::OnceLock::new();
    if let Some(epoch) = EPOCH.get_or_init(|| crate::env::trace().then(std::time::Instant::now)) {
        eprintln!("trace {:10.2} ms {what}", epoch.elapsed().as_secs_f64() * 1e3);
    }
}

/// Is SETFUSION_TRACE set? (A trace point that must wait for the device
/// to say when its work ended asks first, so an untraced run never waits.)
pub fn tracing() -> bool {
    crate::env::trace()
}

/// One line, for stderr and EXPLAIN: DataFusion errors can span lines.
pub fn one_line(e: &DataFusionError) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Do composite keys whose columns take `ranges` slots each fit one exact
/// 64-bit mixed-radix key (`key = key * range + slot`, column by column)?
/// The one test for the host's packing (`keys::encode_packed`) and the
/// device's (`gpu::pack_key_columns`): the slots' product must not pass
/// 2^64, and no column may be empty.
pub fn mixed_radix_fits(ranges: impl IntoIterator<Item = u128>) -> bool {
    ranges.into_iter().try_fold(1u128, |acc, r| acc.checked_mul(r).filter(|p| r > 0 && *p <= 1u128 << 64)).is_some()
}

/// `len` default values (zeros) written into a fresh allocation, where
/// `vec![0; len]` would be calloc's untouched pages: there the first read of
/// a page maps the shared zero page and the first write after it copies the
/// page and flushes the old mapping from every thread's TLB (an IPI to each
/// core). Counters and bit words that are read before they are written paid
/// that per page: in fresh processes it was most of building a 32 MB count
/// table (perf: `ptep_clear_flush`, `native_write_msr`).
pub fn written_defaults<T: Default>(len: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    // Hides the fresh allocation from the optimizer, which would otherwise
    // turn the allocation and its zeroing back into one calloc.
    std::hint::black_box(&mut v);
    v.resize_with(len, T::default);
    v
}

/// A xorshift64 generator (shifts 13, 7, 17): reproducible test, doctor and
/// benchmark data without a random crate's versioned streams. The state must
/// not be 0.
#[derive(Debug, Clone)]
pub struct Xorshift64(pub u64);

impl Xorshift64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (below 1 where `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A double's place in DataFusion's order, from its bits, as a signed
/// integer: IEEE's total order (`f64::total_cmp`: a NaN equals only a NaN of
/// the same bits, the NaN with the sign bit is below every number, the
/// others above) once -0.0 is made 0.0, as DataFusion makes it before it
/// compares floats (so -0.0 = 0.0, and -0.0 < 0.0 is false). The device's
/// `jf_total` (kernels/join_filter.cu) is the twin.
pub fn double_order_key(bits: u64) -> i64 {
    let bits = if bits == 1 << 63 { 0 } else { bits as i64 };
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// Does a value of type `t` hold a float: a float, or a dictionary, struct
/// or list of them? (Such values compare as their floats do.)
pub fn holds_float(t: &datafusion::arrow::datatypes::DataType) -> bool {
    use datafusion::arrow::datatypes::DataType;
    match t {
        DataType::Dictionary(_, v) => holds_float(v),
        DataType::Struct(fields) => fields.iter().any(|f| holds_float(f.data_type())),
        DataType::List(f) | DataType::LargeList(f) | DataType::ListView(f) | DataType::LargeListView(f) => {
            holds_float(f.data_type())
        }
        DataType::FixedSizeList(f, _) => holds_float(f.data_type()),
        t => t.is_floating(),
    }
}
