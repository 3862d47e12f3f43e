//! Semi / anti / mark joins with a residual filter (issue 14, item 3): the
//! launcher of `kernels/join_filter.cu` and its CPU twin.
//!
//! A probe row's *group* is the build rows with an equal key (NULL keys have
//! none; without keys every build row is in every group). The build keys are
//! radix-sorted with their row ids on the device, so each group is one run of
//! the sorted rows, found by binary search ([`groups_gpu`] / [`groups_cpu`]).
//! A residual filter that [`Programs`] can express (comparisons, arithmetic,
//! casts, AND / OR / NOT, IS [NOT] NULL over fixed-width columns of both sides:
//! `src/exec/pair_filter.rs` compiles DataFusion's expression) is then
//! evaluated on the device over each probe row's run, and reduced to per-row
//! facts ([`facts_gpu`] / [`facts_cpu`]); no candidate pair is ever
//! materialised, so keys with many duplicates cost time, not memory. A
//! filter the program cannot express is evaluated on the host over the
//! device's groups (the caller's part).
//!
//! Exactness: checked integer and decimal arithmetic. A result outside its
//! type's range makes the whole evaluation return `None`, and the caller
//! evaluates with DataFusion's expression instead (which raises or wraps as it
//! does). Floats compare in IEEE total order, like Arrow's kernels; Float32
//! arithmetic rounds every result to f32, as f32 arithmetic does.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};

use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};
use crate::keys::KeyColumns;

/// kernels/join_filter.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "join_filter",
    source: include_str!("../../kernels/join_filter.cu"),
    defines: join_filter_defines,
};

fn join_filter_defines() -> Vec<(String, u64)> {
    let mut d = crate::gpu::prefixed("JF_", &op::ALL.iter().map(|&(n, c)| (n, c as u64)).collect::<Vec<_>>());
    d.extend(ValueKind::ALL.iter().map(|(name, k)| (format!("JF_K_{name}"), *k as u64)));
    d.push(("JF_RANGE_DEC".into(), RANGE_DEC as u64));
    d.push(("JF_STACK".into(), STACK as u64));
    d
}

/// Program ops: the `JF_*` defines of `kernels/join_filter.cu` (a unit test
/// checks that both agree).
pub mod op {
    pub const COL: u32 = 1;
    pub const LIT: u32 = 2;
    pub const NULL: u32 = 3;
    pub const ADD_I: u32 = 10;
    pub const SUB_I: u32 = 11;
    pub const MUL_I: u32 = 12;
    pub const NEG_I: u32 = 13;
    pub const ADD_F: u32 = 20;
    pub const SUB_F: u32 = 21;
    pub const MUL_F: u32 = 22;
    pub const DIV_F: u32 = 23;
    pub const NEG_F: u32 = 24;
    pub const EQ_I: u32 = 30;
    pub const NE_I: u32 = 31;
    pub const LT_I: u32 = 32;
    pub const LE_I: u32 = 33;
    pub const GT_I: u32 = 34;
    pub const GE_I: u32 = 35;
    pub const EQ_F: u32 = 40;
    pub const NE_F: u32 = 41;
    pub const LT_F: u32 = 42;
    pub const LE_F: u32 = 43;
    pub const GT_F: u32 = 44;
    pub const GE_F: u32 = 45;
    pub const AND: u32 = 50;
    pub const OR: u32 = 51;
    pub const NOT: u32 = 52;
    pub const IS_NULL: u32 = 53;
    pub const IS_NOT_NULL: u32 = 54;
    pub const I2F: u32 = 60;
    pub const SCALE_I: u32 = 61;
    pub const DEC2F: u32 = 62;
    pub const F2F32: u32 = 63;
    pub const CHECK_I: u32 = 64;
    /// Every op with its kernel name, for the agreement test.
    pub const ALL: &[(&str, u32)] = &[
        ("COL", COL),
        ("LIT", LIT),
        ("NULL", NULL),
        ("ADD_I", ADD_I),
        ("SUB_I", SUB_I),
        ("MUL_I", MUL_I),
        ("NEG_I", NEG_I),
        ("ADD_F", ADD_F),
        ("SUB_F", SUB_F),
        ("MUL_F", MUL_F),
        ("DIV_F", DIV_F),
        ("NEG_F", NEG_F),
        ("EQ_I", EQ_I),
        ("NE_I", NE_I),
        ("LT_I", LT_I),
        ("LE_I", LE_I),
        ("GT_I", GT_I),
        ("GE_I", GE_I),
        ("EQ_F", EQ_F),
        ("NE_F", NE_F),
        ("LT_F", LT_F),
        ("LE_F", LE_F),
        ("GT_F", GT_F),
        ("GE_F", GE_F),
        ("AND", AND),
        ("OR", OR),
        ("NOT", NOT),
        ("IS_NULL", IS_NULL),
        ("IS_NOT_NULL", IS_NOT_NULL),
        ("I2F", I2F),
        ("SCALE_I", SCALE_I),
        ("DEC2F", DEC2F),
        ("F2F32", F2F32),
        ("CHECK_I", CHECK_I),
    ];
}

/// Ranges of checked integer results (an op's `arg`): all of i64, i8 / i16
/// / i32, u8 / u16 / u32, and from [`RANGE_DEC`]`+ p` a decimal of precision p.
pub const RANGE_I64: u32 = 0;
pub const RANGE_DEC: u32 = 7;
/// The kernel's stack depth (JF_STACK).
pub const STACK: usize = 16;

/// How a column's values are stored (the kernel's `JF_K_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    I8 = 0,
    I16 = 1,
    I32 = 2,
    I64 = 3,
    U8 = 4,
    U16 = 5,
    U32 = 6,
    F32 = 7,
    F64 = 8,
    Bool = 9,
    /// Decimal128 of at most 18 digits: the low 8 bytes of each 16.
    Dec128 = 10,
}

impl ValueKind {
    /// Every kind with its kernel name (`JF_K_<name>`).
    pub const ALL: [(&'static str, ValueKind); 11] = [
        ("I8", ValueKind::I8),
        ("I16", ValueKind::I16),
        ("I32", ValueKind::I32),
        ("I64", ValueKind::I64),
        ("U8", ValueKind::U8),
        ("U16", ValueKind::U16),
        ("U32", ValueKind::U32),
        ("F32", ValueKind::F32),
        ("F64", ValueKind::F64),
        ("BOOL", ValueKind::Bool),
        ("DEC128", ValueKind::Dec128),
    ];

    /// The kind of a column type the programs read (None: not readable).
    pub fn of(t: &DataType) -> Option<ValueKind> {
        use DataType::*;
        Some(match t {
            Int8 => ValueKind::I8,
            Int16 => ValueKind::I16,
            Int32 | Date32 | Time32(_) => ValueKind::I32,
            Int64 | Date64 | Timestamp(_, _) | Time64(_) | Duration(_) => ValueKind::I64,
            UInt8 => ValueKind::U8,
            UInt16 => ValueKind::U16,
            UInt32 => ValueKind::U32,
            Float32 => ValueKind::F32,
            Float64 => ValueKind::F64,
            Boolean => ValueKind::Bool,
            Decimal128(p, _) if *p <= 18 => ValueKind::Dec128,
            _ => return None,
        })
    }
    /// Bytes per value (0: bit-packed).
    fn width(self) -> usize {
        match self {
            ValueKind::I8 | ValueKind::U8 => 1,
            ValueKind::I16 | ValueKind::U16 => 2,
            ValueKind::I32 | ValueKind::U32 | ValueKind::F32 => 4,
            ValueKind::I64 | ValueKind::F64 => 8,
            ValueKind::Bool => 0,
            ValueKind::Dec128 => 16,
        }
    }
}

/// One instruction of a postfix program (the kernel's `JfInstr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instr {
    pub op: u32,
    pub arg: u32,
    pub imm: u64,
}

impl Instr {
    pub fn new(op: u32, arg: u32, imm: u64) -> Self {
        Self { op, arg, imm }
    }
}

/// The programs of one join: the filter, and for IN the key equality and the
/// build key's NULL test (each over the same columns).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Programs {
    pub filter: Vec<Instr>,
    pub in_keys: Option<(Vec<Instr>, Vec<Instr>)>,
}

/// Per probe row: some pair passes the filter (the group is not empty). A
/// matched row carries only [`NONEMPTY`] | [`MATCHED`] (a search stops at its
/// match, so whether a NULL key came before it is not defined).
pub const NONEMPTY: u8 = 1;
/// Some passing pair has equal IN keys (EXISTS: the same as [`NONEMPTY`]).
pub const MATCHED: u8 = 2;
/// Some passing pair has a NULL build IN key.
pub const HAS_NULL: u8 = 4;

/// One column the programs read: `from_probe` says whose row indexes it.
/// The values stay in their Arrow buffers (booleans are re-packed).
pub struct PairColumn {
    pub from_probe: bool,
    kind: ValueKind,
    /// Value bytes per batch, back to back in row order.
    values: Vec<Buffer>,
    /// Validity over all rows (None: no NULLs).
    validity: Option<BooleanBuffer>,
}

impl PairColumn {
    /// A column given per batch; every array of one type that [`ValueKind::of`] accepts.
    pub fn new(from_probe: bool, arrays: &[ArrayRef]) -> Result<Self> {
        let t = arrays.first().map(|a| a.data_type().clone()).unwrap_or(DataType::Int64);
        let kind =
            ValueKind::of(&t).ok_or_else(|| DataFusionError::Internal(format!("join filter: a column of {t}")))?;
        let len = arrays.iter().map(|a| a.len()).sum();
        let values = if kind == ValueKind::Bool {
            let mut bits = datafusion::arrow::array::BooleanBufferBuilder::new(len);
            for a in arrays {
                bits.append_buffer(a.as_boolean().values());
            }
            vec![bits.finish().into_inner()]
        } else {
            let w = kind.width();
            arrays
                .iter()
                .map(|a| {
                    let d = a.to_data();
                    d.buffers()[0].slice_with_length(d.offset() * w, d.len() * w)
                })
                .collect()
        };
        let validity = if arrays.iter().any(|a| a.null_count() > 0) {
            let mut bits = datafusion::arrow::array::BooleanBufferBuilder::new(len);
            for a in arrays {
                match a.nulls() {
                    Some(n) => bits.append_buffer(n.inner()),
                    None => bits.append_n(a.len(), true),
                }
            }
            Some(bits.finish())
        } else {
            None
        };
        Ok(Self { from_probe, kind, values, validity })
    }
}

/// The inputs of one filtered join.
pub struct PairJoin<'a> {
    /// Equality keys of each side (exact 64-bit keys, `keys::encode` /
    /// `encode_packed`); None: no keys, every build row is in every group.
    pub keys: Option<(&'a KeyColumns, &'a KeyColumns)>,
    pub n: usize,
    pub nb: usize,
    pub columns: &'a [PairColumn],
    pub programs: &'a Programs,
}

/// Each probe row's group: `rows[ranges[p].0 .. ranges[p].1]` are its build
/// rows (ascending within a group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups {
    pub rows: Vec<u32>,
    pub ranges: Vec<(u32, u32)>,
}

fn check_sizes(n: usize, nb: usize) -> Result<()> {
    if nb >= u32::MAX as usize || n >= u32::MAX as usize {
        return Err(DataFusionError::Execution(format!("join filter: {n} x {nb} rows exceed 32-bit row ids")));
    }
    Ok(())
}

// ------------------------------------------------------------------ CPU twin

/// The groups on the host: valid build keys sorted with their rows (stable),
/// each probe key's run found by binary search.
pub fn groups_cpu(probe: &KeyColumns, build: &KeyColumns) -> Result<Groups> {
    check_sizes(probe.len(), build.len())?;
    let mut pairs: Vec<(u64, u32)> =
        build.iter().enumerate().filter(|&(i, _)| !build.is_null(i)).map(|(i, k)| (k, i as u32)).collect();
    pairs.sort_unstable();
    let sorted: Vec<u64> = pairs.iter().map(|p| p.0).collect();
    let ranges = probe
        .iter()
        .enumerate()
        .map(|(p, k)| {
            if probe.is_null(p) {
                return (0, 0);
            }
            let lo = sorted.partition_point(|&x| x < k);
            let hi = lo + sorted[lo..].partition_point(|&x| x == k);
            (lo as u32, hi as u32)
        })
        .collect();
    Ok(Groups { rows: pairs.into_iter().map(|p| p.1).collect(), ranges })
}

/// A column's values in one slice, for the twin's random access.
struct HostColumn {
    from_probe: bool,
    kind: ValueKind,
    bytes: Vec<u8>,
    validity: Option<BooleanBuffer>,
}

impl HostColumn {
    fn of(c: &PairColumn) -> Self {
        let bytes = c.values.iter().flat_map(|b| b.as_slice().iter().copied()).collect();
        Self { from_probe: c.from_probe, kind: c.kind, bytes, validity: c.validity.clone() }
    }

    /// The value of `row` in its lane (the kernel's `jf_load`) and whether it is NULL.
    fn load(&self, row: usize) -> (u64, bool) {
        let null = self.validity.as_ref().is_some_and(|v| !v.value(row));
        let b = &self.bytes;
        let le = |w: usize| {
            let mut x = [0u8; 8];
            x[..w].copy_from_slice(&b[row * w..row * w + w]);
            u64::from_le_bytes(x)
        };
        let v = match self.kind {
            ValueKind::I8 => le(1) as u8 as i8 as i64 as u64,
            ValueKind::I16 => le(2) as u16 as i16 as i64 as u64,
            ValueKind::I32 => le(4) as u32 as i32 as i64 as u64,
            ValueKind::I64 | ValueKind::F64 => le(8),
            ValueKind::U8 => le(1),
            ValueKind::U16 => le(2),
            ValueKind::U32 => le(4),
            ValueKind::F32 => (f32::from_bits(le(4) as u32) as f64).to_bits(),
            ValueKind::Bool => ((b[row >> 3] >> (row & 7)) & 1) as u64,
            ValueKind::Dec128 => u64::from_le_bytes(b[row * 16..row * 16 + 8].try_into().unwrap()),
        };
        (v, null)
    }
}

fn in_range(v: i64, range: u32) -> bool {
    match range {
        0 => true,
        1 => i8::try_from(v).is_ok(),
        2 => i16::try_from(v).is_ok(),
        3 => i32::try_from(v).is_ok(),
        4 => u8::try_from(v).is_ok(),
        5 => u16::try_from(v).is_ok(),
        6 => u32::try_from(v).is_ok(),
        r => {
            let p = r - RANGE_DEC;
            p >= 19 || v.unsigned_abs() < 10u64.pow(p)
        }
    }
}

/// A double's place in DataFusion's order ([`crate::util::double_order_key`]).
fn total(bits: u64) -> i64 {
    crate::util::double_order_key(bits)
}

fn round(d: f64, to_f32: u32) -> f64 {
    if to_f32 != 0 {
        d as f32 as f64
    } else {
        d
    }
}

/// The kernel's `jf_eval`: TRUE only passes. Sets `error` on a checked overflow.
fn eval(prog: &[Instr], cols: &[HostColumn], p: usize, b: usize, error: &mut bool) -> bool {
    let mut v = [0u64; STACK];
    let mut nl = [false; STACK];
    let mut sp = 0usize;
    let f = f64::from_bits;
    for ins in prog {
        let o = ins.op;
        match o {
            op::COL => {
                let c = &cols[ins.arg as usize];
                (v[sp], nl[sp]) = c.load(if c.from_probe { p } else { b });
                sp += 1;
            }
            op::LIT => {
                (v[sp], nl[sp]) = (ins.imm, false);
                sp += 1;
            }
            op::NULL => {
                (v[sp], nl[sp]) = (0, true);
                sp += 1;
            }
            op::NOT
            | op::NEG_I
            | op::NEG_F
            | op::IS_NULL
            | op::IS_NOT_NULL
            | op::I2F
            | op::SCALE_I
            | op::DEC2F
            | op::F2F32
            | op::CHECK_I => {
                let (a, an) = (v[sp - 1], nl[sp - 1]);
                let (mut r, mut rn) = (a, an);
                match o {
                    op::NOT => r = a ^ 1,
                    op::NEG_I => {
                        let out = 0i64.checked_sub(a as i64);
                        if !an && !out.is_some_and(|x| in_range(x, ins.arg)) {
                            *error = true;
                        }
                        r = (a as i64).wrapping_neg() as u64;
                    }
                    op::NEG_F => r = round(-f(a), ins.arg).to_bits(),
                    op::IS_NULL => (r, rn) = (an as u64, false),
                    op::IS_NOT_NULL => (r, rn) = (!an as u64, false),
                    op::I2F => {
                        r = if ins.arg != 0 { (a as i64 as f32 as f64).to_bits() } else { (a as i64 as f64).to_bits() }
                    }
                    op::SCALE_I => {
                        let out = (a as i64).checked_mul(ins.imm as i64);
                        if !an && !out.is_some_and(|x| in_range(x, ins.arg)) {
                            *error = true;
                        }
                        r = (a as i64).wrapping_mul(ins.imm as i64) as u64;
                    }
                    op::DEC2F => r = round(a as i64 as f64 / ins.imm as i64 as f64, ins.arg).to_bits(),
                    op::F2F32 => r = (f(a) as f32 as f64).to_bits(),
                    _ => {
                        if !an && !in_range(a as i64, ins.arg) {
                            *error = true;
                        }
                    }
                }
                (v[sp - 1], nl[sp - 1]) = (r, rn);
            }
            _ => {
                let (a, an, c, cn) = (v[sp - 2], nl[sp - 2], v[sp - 1], nl[sp - 1]);
                sp -= 1;
                let mut rn = an || cn;
                let r: u64 = match o {
                    op::AND => {
                        if (!an && a == 0) || (!cn && c == 0) {
                            rn = false;
                            0
                        } else {
                            1
                        }
                    }
                    op::OR => {
                        if (!an && a != 0) || (!cn && c != 0) {
                            rn = false;
                            1
                        } else {
                            0
                        }
                    }
                    op::ADD_I | op::SUB_I | op::MUL_I => {
                        let (x, y) = (a as i64, c as i64);
                        let out = match o {
                            op::ADD_I => x.checked_add(y),
                            op::SUB_I => x.checked_sub(y),
                            _ => x.checked_mul(y),
                        };
                        if !rn && !out.is_some_and(|z| in_range(z, ins.arg)) {
                            *error = true;
                        }
                        match o {
                            op::ADD_I => x.wrapping_add(y) as u64,
                            op::SUB_I => x.wrapping_sub(y) as u64,
                            _ => x.wrapping_mul(y) as u64,
                        }
                    }
                    op::ADD_F | op::SUB_F | op::MUL_F | op::DIV_F => {
                        let (x, y) = (f(a), f(c));
                        let out = match o {
                            op::ADD_F => x + y,
                            op::SUB_F => x - y,
                            op::MUL_F => x * y,
                            _ => x / y,
                        };
                        round(out, ins.arg).to_bits()
                    }
                    _ => {
                        let (x, y, cmp) = if o >= op::EQ_F {
                            (total(a), total(c), o - op::EQ_F)
                        } else {
                            (a as i64, c as i64, o - op::EQ_I)
                        };
                        (match cmp {
                            0 => x == y,
                            1 => x != y,
                            2 => x < y,
                            3 => x <= y,
                            4 => x > y,
                            _ => x >= y,
                        }) as u64
                    }
                };
                (v[sp - 1], nl[sp - 1]) = (r, rn);
            }
        }
    }
    sp > 0 && !nl[sp - 1] && v[sp - 1] != 0
}

/// One pair's facts (the kernel's `jf_pair`).
fn pair_facts(programs: &Programs, cols: &[HostColumn], p: usize, b: usize, error: &mut bool) -> u8 {
    if !eval(&programs.filter, cols, p, b, error) {
        return 0;
    }
    let Some((equal, null)) = &programs.in_keys else { return NONEMPTY | MATCHED };
    if eval(equal, cols, p, b, error) {
        NONEMPTY | MATCHED
    } else if eval(null, cols, p, b, error) {
        NONEMPTY | HAS_NULL
    } else {
        NONEMPTY
    }
}

/// Per probe row its facts ([`NONEMPTY`] | [`MATCHED`] | [`HAS_NULL`]), on
/// all cores; None when checked arithmetic overflowed somewhere.
pub fn facts_cpu(j: &PairJoin<'_>) -> Result<Option<Vec<u8>>> {
    check_sizes(j.n, j.nb)?;
    let groups = match j.keys {
        Some((probe, build)) => Some(groups_cpu(probe, build)?),
        None => None,
    };
    let cols: Vec<HostColumn> = j.columns.iter().map(HostColumn::of).collect();
    let chunks: Vec<(usize, usize)> = (0..j.n).step_by(1 << 14).map(|s| (s, (s + (1 << 14)).min(j.n))).collect();
    let parts = crate::host::par_map(&chunks, 1, |&(s, e)| {
        let mut error = false;
        let facts: Vec<u8> = (s..e)
            .map(|p| {
                let (lo, hi) = groups.as_ref().map_or((0, j.nb), |g| (g.ranges[p].0 as usize, g.ranges[p].1 as usize));
                let mut f = 0u8;
                for k in lo..hi {
                    let b = groups.as_ref().map_or(k, |g| g.rows[k] as usize);
                    f |= pair_facts(j.programs, &cols, p, b, &mut error);
                    if f & MATCHED != 0 {
                        return NONEMPTY | MATCHED;
                    }
                }
                f
            })
            .collect();
        Ok::<_, DataFusionError>((facts, error))
    })?;
    if parts.iter().any(|(_, e)| *e) {
        return Ok(None);
    }
    Ok(Some(parts.into_iter().flat_map(|(f, _)| f).collect()))
}

/// One column of one table as the device Parquet scan decodes it (the
/// input of a scan's filter): every value a sign-extended 64-bit lane, the
/// validity in LSB-first 32-bit words (None: no NULLs).
#[derive(Clone, Copy)]
pub struct RowColumn<'a> {
    pub values: &'a [u64],
    pub validity: Option<&'a [u32]>,
}

/// A table's row filter on the host: bit r (LSB-first 32-bit words) is set
/// when `prog` (every column read at row r) is TRUE on row r of the `n` rows;
/// None when checked arithmetic overflowed on some row. CPU twin of
/// [`pass_rows_gpu`].
pub fn pass_rows_cpu(columns: &[RowColumn<'_>], n: usize, prog: &[Instr]) -> Result<Option<Vec<u32>>> {
    if columns.iter().any(|c| c.values.len() < n || c.validity.is_some_and(|v| v.len() < n.div_ceil(32))) {
        return Err(DataFusionError::Internal("row filter: a column shorter than the table".into()));
    }
    let cols: Vec<HostColumn> = columns
        .iter()
        .map(|c| HostColumn {
            from_probe: true,
            kind: ValueKind::I64,
            bytes: c.values[..n].iter().flat_map(|v| v.to_le_bytes()).collect(),
            validity: c.validity.map(|w| BooleanBuffer::new(Buffer::from_vec(w.to_vec()), 0, n)),
        })
        .collect();
    let mut words = vec![0u32; n.div_ceil(32)];
    let mut error = false;
    for r in 0..n {
        if eval(prog, &cols, r, r, &mut error) {
            words[r / 32] |= 1 << (r % 32);
        }
    }
    Ok((!error).then_some(words))
}

// -------------------------------------------------------------------- device

fn grid(gpu: &Gpu, threads: usize) -> LaunchConfig {
    gpu.grid_stride(threads, 16)
}

/// Validity bits with offset 0, as bytes (None: no NULLs).
fn validity_bytes(v: Option<&BooleanBuffer>) -> Option<Buffer> {
    v.filter(|b| b.count_set_bits() < b.len()).map(|b| b.sliced())
}

/// The sorted build keys (`key - min`) and their rows on the device, each
/// probe row's run [lo, hi) in them, and the total of the runs' lengths.
struct DeviceGroups {
    rows: Option<DeviceBuffer<u32>>,
    lo: DeviceBuffer<u32>,
    hi: DeviceBuffer<u32>,
    pairs: u64,
    valid_build: usize,
}

fn device_groups(
    gpu: &Gpu,
    keys: Option<(&KeyColumns, &KeyColumns)>,
    n: usize,
    nb: usize,
    stats: &mut TransferStats,
) -> Result<DeviceGroups> {
    check_sizes(n, nb)?;
    let stream = gpu.stream();
    let lo = gpu.alloc::<u32>(n)?;
    let hi = gpu.alloc::<u32>(n)?;
    let total = gpu.alloc_zeros::<u64>(1)?;
    let n64 = n as u64;
    let Some((probe, build)) = keys else {
        // No keys: one group, all build rows (the kernel writes [0, nb) for every row).
        let f = gpu.function(&KERNEL, "jf_ranges")?;
        let (zero, nb64) = (0u64, nb as u64);
        // SAFETY: signature matches kernels/join_filter.cu; null key pointers mean "no keys"; lo / hi hold n, total 1.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&zero)
                .arg(&zero)
                .arg(&n64)
                .arg(&zero)
                .arg(&nb64)
                .arg(&zero)
                .arg(&zero)
                .arg(&lo.slice)
                .arg(&hi.slice)
                .arg(&total.slice)
                .launch(grid(gpu, n))
        }
        .map_err(|e| cuda_err("jf_ranges", e))?;
        return Ok(DeviceGroups { rows: None, lo, hi, pairs: n as u64 * nb as u64, valid_build: nb });
    };
    // Valid build keys with their rows (compacted on the host only when some are NULL).
    let (mut sorted, mut rows, range, valid_build) = if build.null_count() == 0 {
        let (keys, range) = gpu.upload_keys(&build.slices(), stats)?;
        let Some((min, max)) = range else {
            return empty_groups(gpu, lo, hi);
        };
        let (off, rows) = crate::algo::radix_sort::offset_keys_u64(gpu, &keys, nb, min, true)?;
        (off, rows.expect("asked for rows"), (min, max), nb)
    } else {
        let (mut keys, mut ids) = (Vec::with_capacity(nb), Vec::with_capacity(nb));
        for (i, k) in build.iter().enumerate() {
            if !build.is_null(i) {
                keys.push(k);
                ids.push(i as u32);
            }
        }
        let (Some(&min), Some(&max)) = (keys.iter().min(), keys.iter().max()) else {
            return empty_groups(gpu, lo, hi);
        };
        let dev = gpu.upload(&keys, stats)?;
        let (off, _) = crate::algo::radix_sort::offset_keys_u64(gpu, &dev, keys.len(), min, false)?;
        (off, gpu.upload(&ids, stats)?, (min, max), keys.len())
    };
    let span = range.1 - range.0;
    let bits = 64 - span.leading_zeros();
    crate::algo::radix_sort::sort_pairs_u64(gpu, &mut sorted, &mut rows, valid_build, 0, bits)?;
    let (probe_keys, _) = gpu.upload_keys_each(&probe.slices(), stats, false, &mut |_, _| Ok(()))?;
    let probe_valid = match validity_bytes(probe.nulls.as_ref().map(|n| n.inner())) {
        Some(bits) => Some(gpu.upload(bits.as_slice(), stats)?),
        None => None,
    };
    let f = gpu.function(&KERNEL, "jf_ranges")?;
    let (nbv, min) = (valid_build as u64, range.0);
    let null: u64 = 0;
    // SAFETY: signature matches kernels/join_filter.cu; probe_keys hold n keys (probe_valid n bits when
    // present, else a null pointer), sorted holds nbv keys; lo / hi hold n, total 1.
    unsafe {
        let mut l = stream.launch_builder(&f);
        l.arg(&probe_keys.slice);
        match &probe_valid {
            Some(v) => l.arg(&v.slice),
            None => l.arg(&null),
        };
        l.arg(&n64).arg(&sorted.slice).arg(&nbv).arg(&min).arg(&span).arg(&lo.slice).arg(&hi.slice).arg(&total.slice);
        l.launch(grid(gpu, n))
    }
    .map_err(|e| cuda_err("jf_ranges", e))?;
    let pairs = gpu.read_one(&total, 0, stats)?;
    Ok(DeviceGroups { rows: Some(rows), lo, hi, pairs, valid_build })
}

/// Groups when no build key is valid: every run empty.
fn empty_groups(gpu: &Gpu, mut lo: DeviceBuffer<u32>, mut hi: DeviceBuffer<u32>) -> Result<DeviceGroups> {
    gpu.stream().memset_zeros(&mut lo.slice).map_err(|e| cuda_err("memset", e))?;
    gpu.stream().memset_zeros(&mut hi.slice).map_err(|e| cuda_err("memset", e))?;
    Ok(DeviceGroups { rows: Some(gpu.alloc::<u32>(1)?), lo, hi, pairs: 0, valid_build: 0 })
}

/// [`groups_cpu`] on the device: the sort and the searches there, the rows
/// and runs downloaded (for a filter the host evaluates).
pub fn groups_gpu(gpu: &Gpu, probe: &KeyColumns, build: &KeyColumns, stats: &mut TransferStats) -> Result<Groups> {
    let (n, nb) = (probe.len(), build.len());
    let g = device_groups(gpu, Some((probe, build)), n, nb, stats)?;
    let rows = match &g.rows {
        Some(r) if g.valid_build > 0 => gpu.download(r, g.valid_build, stats)?,
        _ => Vec::new(),
    };
    let lo = gpu.download(&g.lo, n, stats)?;
    let hi = gpu.download(&g.hi, n, stats)?;
    Ok(Groups { rows, ranges: lo.into_iter().zip(hi).collect() })
}

/// Byte slices uploaded back to back as one buffer.
#[derive(Default)]
struct Packed<'a> {
    parts: Vec<&'a [u8]>,
    len: usize,
}

impl<'a> Packed<'a> {
    fn push(&mut self, bytes: &'a [u8]) {
        self.parts.push(bytes);
        self.len += bytes.len();
    }
    /// Pad to a multiple of 16 bytes (the next column's alignment).
    fn align16(&mut self, zeros: &'a [u8; 16]) {
        self.push(&zeros[..self.len.next_multiple_of(16) - self.len]);
    }
}

/// 64-bit integer columns of at least this many bytes cross PCIe packed
/// ([`Gpu::upload_words_into_bytes`]); smaller ones are not worth a pipeline of their own.
const PACKED_VALUES_MIN: usize = 1 << 20;

/// The columns' values in one device buffer of `len` bytes, column `i` from
/// byte `descs[3 * i]` (the alignment padding between them is not written).
/// 64-bit integer columns (TPC-H Q21's `l_suppkey`) cross PCIe frame-of-reference
/// packed like keys, usually 4 bytes a value instead of 8; the others as their Arrow bytes.
fn upload_values(
    gpu: &Gpu,
    columns: &[PairColumn],
    descs: &[u64],
    len: usize,
    stats: &mut TransferStats,
) -> Result<DeviceBuffer<u8>> {
    let mut values = gpu.alloc::<u8>(len)?;
    let mut raw: Vec<&[u8]> = Vec::new();
    let mut raw_at = 0usize;
    let flush = |raw: &mut Vec<&[u8]>, at: usize, values: &mut DeviceBuffer<u8>, stats: &mut TransferStats| {
        let r = gpu.upload_chunks_into(raw, values, at, stats);
        raw.clear();
        r
    };
    for (i, c) in columns.iter().enumerate() {
        let at = descs[3 * i] as usize;
        let bytes: usize = c.values.iter().map(|b| b.len()).sum();
        let words = (c.kind == ValueKind::I64 && bytes >= PACKED_VALUES_MIN)
            .then(|| {
                let aligned = |b: &Buffer| b.as_ptr() as usize % 8 == 0 && b.len() % 8 == 0;
                c.values.iter().map(|b| aligned(b).then(|| b.typed_data::<u64>())).collect::<Option<Vec<&[u64]>>>()
            })
            .flatten();
        match words {
            Some(words) => {
                flush(&mut raw, raw_at, &mut values, stats)?;
                gpu.upload_words_into_bytes(&words, &mut values, at, stats)?;
            }
            None => {
                // Adjacent raw columns go in one upload (the padding between them is sent too).
                if raw.is_empty() {
                    raw_at = at;
                } else {
                    let sent: usize = raw.iter().map(|r| r.len()).sum();
                    raw.push(&PADDING[..at - raw_at - sent]);
                }
                raw.extend(c.values.iter().map(|b| b.as_slice()));
            }
        }
    }
    flush(&mut raw, raw_at, &mut values, stats)?;
    Ok(values)
}

/// Zero bytes standing for the alignment padding between raw columns.
static PADDING: [u8; 16] = [0; 16];

/// Average run length from which a warp, not a thread, takes a probe row.
const WARP_RUN: u64 = 16;

/// [`facts_cpu`] on the device.
pub fn facts_gpu(gpu: &Gpu, j: &PairJoin<'_>, stats: &mut TransferStats) -> Result<Option<Vec<u8>>> {
    let (n, nb) = (j.n, j.nb);
    if n == 0 {
        return Ok(Some(Vec::new()));
    }
    let groups = device_groups(gpu, j.keys, n, nb, stats)?;
    // The columns: values and validity each in one buffer, every column 16-byte aligned.
    let zeros = [0u8; 16];
    let validity: Vec<Option<Buffer>> = j.columns.iter().map(|c| validity_bytes(c.validity.as_ref())).collect();
    let mut valids = Packed::default();
    let mut descs: Vec<u64> = Vec::with_capacity(j.columns.len() * 3);
    let mut values_len = 0usize;
    for (c, valid) in j.columns.iter().zip(&validity) {
        descs.push(values_len as u64);
        values_len = (values_len + c.values.iter().map(|b| b.len()).sum::<usize>()).next_multiple_of(16);
        match valid {
            Some(bits) => {
                descs.push(valids.len as u64);
                valids.push(bits.as_slice());
                valids.align16(&zeros);
            }
            None => descs.push(u64::MAX),
        }
        descs.push(c.kind as u64 | (c.from_probe as u64) << 32);
    }
    // Never empty buffers (a column-less filter, no NULLs anywhere).
    valids.push(&zeros);
    let values = upload_values(gpu, j.columns, &descs, values_len.max(16), stats)?;
    let valids = gpu.upload_chunks(&valids.parts, stats)?;
    let cols = gpu.upload(&descs, stats)?;
    let mut words: Vec<u64> = Vec::new();
    let mut push = |p: &[Instr]| {
        let start = words.len() / 2;
        for i in p {
            words.push(i.op as u64 | (i.arg as u64) << 32);
            words.push(i.imm);
        }
        (start as u32, p.len() as u32)
    };
    let (_, filter_len) = push(&j.programs.filter);
    let ((eq_start, eq_len), (null_start, null_len)) = match &j.programs.in_keys {
        Some((equal, null)) => (push(equal), push(null)),
        None => ((0, 0), (0, 0)),
    };
    words.push(0);
    let prog = gpu.upload(&words, stats)?;
    let facts = gpu.alloc::<u8>(n)?;
    let error = gpu.alloc_zeros::<u32>(1)?;
    let warp = groups.pairs > WARP_RUN * n as u64;
    let f = gpu.function(&KERNEL, if warp { "jf_facts_warp" } else { "jf_facts_thread" })?;
    let (n64, null) = (n as u64, 0u64);
    let started = std::time::Instant::now();
    // SAFETY: signature matches kernels/join_filter.cu; lo / hi hold n runs into rows (a null pointer when
    // there are no keys: row j is j); the descriptors address the values / validity buffers uploaded above;
    // the programs read only columns below descs.len() / 3 (checked by the compiler); facts holds n.
    unsafe {
        let mut l = gpu.stream().launch_builder(&f);
        l.arg(&groups.lo.slice).arg(&groups.hi.slice).arg(&n64);
        match &groups.rows {
            Some(r) => l.arg(&r.slice),
            None => l.arg(&null),
        };
        l.arg(&cols.slice).arg(&values.slice).arg(&valids.slice).arg(&prog.slice);
        l.arg(&filter_len)
            .arg(&eq_start)
            .arg(&eq_len)
            .arg(&null_start)
            .arg(&null_len)
            .arg(&facts.slice)
            .arg(&error.slice);
        l.launch(grid(gpu, if warp { n * 32 } else { n }))
    }
    .map_err(|e| cuda_err("jf_facts", e))?;
    let out = gpu.download(&facts, n, stats)?;
    stats.kernel += started.elapsed();
    if gpu.read_one(&error, 0, stats)? != 0 {
        return Ok(None);
    }
    Ok(Some(out))
}

/// [`pass_rows_cpu`] on the device: the pass bits of the table's `n` rows
/// (`kernels/join_filter.cu`'s `jf_pass_rows`), left on the device; None
/// when checked arithmetic overflowed on some row. `bit_columns` follow
/// `columns` in the program's numbering: values of 0 or 1 held as bits
/// (LSB-first 32-bit words, e.g. a mark), read as its twin reads their lanes.
pub fn pass_rows_gpu(
    gpu: &Gpu,
    columns: &[(&DeviceBuffer<u64>, Option<&DeviceBuffer<u32>>)],
    bit_columns: &[(&DeviceBuffer<u32>, Option<&DeviceBuffer<u32>>)],
    n: usize,
    prog: &[Instr],
    stats: &mut TransferStats,
) -> Result<Option<DeviceBuffer<u32>>> {
    use cudarc::driver::DevicePtr;
    let words = n.div_ceil(32);
    if columns.iter().any(|(v, valid)| v.len() < n || valid.is_some_and(|w| w.len() < words))
        || bit_columns.iter().any(|(v, valid)| v.len() < words || valid.is_some_and(|w| w.len() < words))
    {
        return Err(DataFusionError::Internal("row filter: a column shorter than the table".into()));
    }
    let mut pass = gpu.alloc_zeros::<u32>(n.div_ceil(32).max(1))?;
    if n == 0 {
        return Ok(Some(pass));
    }
    let stream = gpu.stream();
    // The columns' device addresses, read by the kernel through two pointer arrays.
    let mut guards = Vec::with_capacity(columns.len() * 2);
    let (mut values, mut validity) = (Vec::with_capacity(columns.len() + 1), Vec::with_capacity(columns.len() + 1));
    // A bit column's address is tagged (its lowest bit set): the kernel reads
    // its bits (device addresses are at least 256-byte aligned).
    let lanes = columns.iter().map(|(v, valid)| (v.slice.device_ptr(stream), 0u64, *valid));
    let bits = bit_columns.iter().map(|(v, valid)| (v.slice.device_ptr(stream), 1u64, *valid));
    for ((ptr, g), tag, valid) in lanes.chain(bits) {
        values.push(ptr | tag);
        guards.push(g);
        validity.push(match valid {
            Some(w) => {
                let (ptr, g) = w.slice.device_ptr(stream);
                guards.push(g);
                ptr
            }
            None => 0,
        });
    }
    // Never empty buffers (a filter that reads no column).
    values.push(0);
    validity.push(0);
    let d_values = gpu.upload(&values, stats)?;
    let d_validity = gpu.upload(&validity, stats)?;
    let mut words: Vec<u64> = prog.iter().flat_map(|i| [i.op as u64 | (i.arg as u64) << 32, i.imm]).collect();
    words.push(0);
    let d_prog = gpu.upload(&words, stats)?;
    let error = gpu.alloc_zeros::<u32>(1)?;
    let f = gpu.function(&KERNEL, "jf_pass_rows")?;
    let (n64, len) = (n as u64, prog.len() as u32);
    let started = std::time::Instant::now();
    // SAFETY: signature matches kernels/join_filter.cu; every address in d_values / d_validity is a live
    // buffer of at least n values / ceil(n / 32) words (checked above, kept alive by `columns` and
    // `guards`); the program reads only columns below columns.len() (the compiler's schema); pass holds ceil(n / 32).
    unsafe {
        gpu.stream()
            .launch_builder(&f)
            .arg(&n64)
            .arg(&d_values.slice)
            .arg(&d_validity.slice)
            .arg(&d_prog.slice)
            .arg(&len)
            .arg(&mut pass.slice)
            .arg(&error.slice)
            .launch(grid(gpu, n.next_multiple_of(32)))
    }
    .map_err(|e| cuda_err("jf_pass_rows", e))?;
    let overflowed = gpu.read_one(&error, 0, stats)? != 0;
    stats.kernel += started.elapsed();
    drop(guards);
    Ok((!overflowed).then_some(pass))
}

// ------------------------------------------------------------ checks, tests

/// Random joins for the self-check and the tests: keys with duplicates and
/// NULLs on both sides, and columns of every kind, some with NULLs.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod tests_data {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        ArrayRef, BooleanArray, Decimal128Array, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array,
        Int8Array, UInt32Array,
    };
    use datafusion::arrow::datatypes::DataType;

    use super::{op, Instr, PairColumn, Programs, RANGE_DEC, RANGE_I64};
    use crate::keys::KeyColumns;

    pub use crate::util::Xorshift64 as Rng;

    /// Exact keys of one side from Int64 values (None: NULL), split in batches of `batch` rows.
    pub fn keys(vals: &[Option<i64>], batch: usize) -> KeyColumns {
        let batches: Vec<Vec<ArrayRef>> =
            vals.chunks(batch.max(1)).map(|c| vec![Arc::new(Int64Array::from(c.to_vec())) as ArrayRef]).collect();
        crate::keys::encode(&batches, &[DataType::Int64], None, true).expect("exact keys")
    }

    /// The column names the programs below read, by index: per side i64, i32,
    /// f64, f32, bool, decimal(12, 2), i8, i16, u32.
    pub const KINDS: usize = 9;

    /// One side's columns of `n` rows (NULLs in about a tenth when `nulls`), split in batches.
    pub fn columns(rng: &mut Rng, n: usize, from_probe: bool, nulls: bool, batch: usize) -> Vec<PairColumn> {
        let null = |rng: &mut Rng| nulls && rng.below(10) == 0;
        let mut make = |f: &mut dyn FnMut(&mut Rng) -> ArrayRef| -> PairColumn {
            let arrays: Vec<ArrayRef> = (0..n.div_ceil(batch.max(1)).max(1)).map(|_| f(rng)).collect();
            // Trim to n rows over the batches.
            let mut left = n;
            let arrays: Vec<ArrayRef> = arrays
                .into_iter()
                .map(|a| {
                    let take = left.min(batch.max(1)).min(a.len());
                    left -= take;
                    a.slice(0, take)
                })
                .collect();
            PairColumn::new(from_probe, &arrays).expect("column")
        };
        let b = batch.max(1);
        vec![
            make(&mut |r| Arc::new(Int64Array::from_iter((0..b).map(|_| (!null(r)).then(|| r.below(7) as i64 - 3))))),
            make(&mut |r| {
                Arc::new(Int32Array::from_iter((0..b).map(|_| (!null(r)).then(|| r.below(100) as i32 - 50))))
            }),
            make(&mut |r| {
                let special = [f64::NAN, -0.0, 0.0, f64::INFINITY, -f64::INFINITY, 1.5, -2.25];
                Arc::new(Float64Array::from_iter((0..b).map(|_| {
                    (!null(r)).then(|| {
                        if r.below(4) == 0 {
                            special[r.below(7) as usize]
                        } else {
                            (r.below(1000) as f64 - 500.0) / 8.0
                        }
                    })
                })))
            }),
            make(&mut |r| {
                Arc::new(Float32Array::from_iter(
                    (0..b).map(|_| (!null(r)).then(|| (r.below(1000) as f32 - 500.0) / 3.0)),
                ))
            }),
            make(&mut |r| Arc::new(BooleanArray::from_iter((0..b).map(|_| (!null(r)).then(|| r.below(2) == 0))))),
            make(&mut |r| {
                Arc::new(
                    Decimal128Array::from_iter((0..b).map(|_| (!null(r)).then(|| r.below(20000) as i128 - 10000)))
                        .with_precision_and_scale(12, 2)
                        .unwrap(),
                )
            }),
            make(&mut |r| Arc::new(Int8Array::from_iter((0..b).map(|_| (!null(r)).then(|| r.below(256) as i8))))),
            make(&mut |r| Arc::new(Int16Array::from_iter((0..b).map(|_| (!null(r)).then(|| r.below(65536) as i16))))),
            make(&mut |r| Arc::new(UInt32Array::from_iter((0..b).map(|_| (!null(r)).then(|| r.next_u64() as u32))))),
        ]
    }

    fn col(i: usize, probe: bool) -> Instr {
        Instr::new(op::COL, (i + if probe { 0 } else { KINDS }) as u32, 0)
    }
    fn ins(o: u32, arg: u32) -> Instr {
        Instr::new(o, arg, 0)
    }
    fn lit(v: u64) -> Instr {
        Instr::new(op::LIT, 0, v)
    }

    /// Filters over probe columns 0..KINDS then build columns KINDS..2 KINDS.
    pub fn programs() -> Vec<(&'static str, Programs)> {
        let filter = |f: Vec<Instr>| Programs { filter: f, in_keys: None };
        vec![
            ("probe.i64 <> build.i64", filter(vec![col(0, true), col(0, false), ins(op::NE_I, 0)])),
            (
                "build.f64 < probe.f64 * 2.0",
                filter(vec![col(2, false), col(2, true), lit(2.0f64.to_bits()), ins(op::MUL_F, 0), ins(op::LT_F, 0)]),
            ),
            (
                "(probe.i32 + build.i32 > 10) OR build.bool IS NULL",
                filter(vec![
                    col(1, true),
                    col(1, false),
                    ins(op::ADD_I, 3),
                    lit(10),
                    ins(op::GT_I, 0),
                    col(4, false),
                    ins(op::IS_NULL, 0),
                    ins(op::OR, 0),
                ]),
            ),
            (
                "NOT (probe.bool AND build.bool) AND CAST(probe.f32 + build.f32 AS f32) >= CAST(build.i32 AS f32)",
                filter(vec![
                    col(4, true),
                    col(4, false),
                    ins(op::AND, 0),
                    ins(op::NOT, 0),
                    col(3, true),
                    col(3, false),
                    ins(op::ADD_F, 1),
                    col(1, false),
                    ins(op::I2F, 1),
                    ins(op::GE_F, 0),
                    ins(op::AND, 0),
                ]),
            ),
            (
                "probe.dec - build.dec > CAST(probe.i8 AS decimal(12, 2)) AND CAST(build.dec AS double) <> -0.5",
                filter(vec![
                    col(5, true),
                    col(5, false),
                    ins(op::SUB_I, RANGE_DEC + 13),
                    col(6, true),
                    Instr::new(op::SCALE_I, RANGE_DEC + 12, 100),
                    ins(op::GT_I, 0),
                    col(5, false),
                    Instr::new(op::DEC2F, 0, 100),
                    lit((-0.5f64).to_bits()),
                    ins(op::NE_F, 0),
                    ins(op::AND, 0),
                ]),
            ),
            (
                "-build.i16 <= probe.i16 OR probe.u32 = build.u32",
                filter(vec![
                    col(7, false),
                    ins(op::NEG_I, RANGE_I64),
                    col(7, true),
                    ins(op::LE_I, 0),
                    col(8, true),
                    col(8, false),
                    ins(op::EQ_I, 0),
                    ins(op::OR, 0),
                ]),
            ),
            (
                "IN probe.i32 = build.i32, filter build.i64 >= probe.i64",
                Programs {
                    filter: vec![col(0, false), col(0, true), ins(op::GE_I, 0)],
                    in_keys: Some((
                        vec![col(1, true), col(1, false), ins(op::EQ_I, 0)],
                        vec![col(1, false), ins(op::IS_NULL, 0)],
                    )),
                },
            ),
            ("TRUE (no column)", filter(vec![lit(1)])),
            ("NULL", filter(vec![ins(op::NULL, 0)])),
        ]
    }

    /// A program whose i32-checked sum overflows on large enough values.
    pub fn overflowing() -> Programs {
        Programs {
            filter: vec![col(8, true), col(8, false), ins(op::MUL_I, 3), lit(0), ins(op::GT_I, 0)],
            in_keys: None,
        }
    }
}

/// `setfusion doctor`: random joins, every test program, on the device and the twin.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use tests_data::*;
    let mut rng = Rng(0x5EED_F117);
    let mut checked = 0;
    for (n, nb, key_span) in [(3000usize, 5000usize, 400u64), (200, 20000, 3), (1000, 0, 10)] {
        let pk: Vec<Option<i64>> = (0..n).map(|_| (rng.below(20) != 0).then(|| rng.below(key_span) as i64)).collect();
        let bk: Vec<Option<i64>> = (0..nb).map(|_| (rng.below(20) != 0).then(|| rng.below(key_span) as i64)).collect();
        let (probe, build) = (keys(&pk, 1000), keys(&bk, 1500));
        let mut cols = columns(&mut rng, n, true, true, 1000);
        cols.extend(columns(&mut rng, nb, false, true, 1500));
        for (name, programs) in programs() {
            for keyed in [true, false] {
                let j =
                    PairJoin { keys: keyed.then_some((&probe, &build)), n, nb, columns: &cols, programs: &programs };
                let mut stats = TransferStats::default();
                let (cpu, gpu_facts) = (facts_cpu(&j)?, facts_gpu(gpu, &j, &mut stats)?);
                if cpu != gpu_facts {
                    return Err(DataFusionError::Execution(format!(
                        "join_filter: `{name}` ({n} x {nb}, keys {keyed}) differs from the CPU twin"
                    )));
                }
                checked += 1;
            }
        }
        let mut stats = TransferStats::default();
        if groups_gpu(gpu, &probe, &build, &mut stats)? != groups_cpu(&probe, &build)? {
            return Err(DataFusionError::Execution(format!(
                "join_filter: groups of {n} x {nb} differ from the CPU twin"
            )));
        }
    }
    let rows = row_filter_check(gpu, &mut rng)?;
    Ok(format!("{checked} filtered joins, 3 groupings and {rows} row filters match the CPU twin"))
}

/// The device Parquet scan's row filter ([`pass_rows_gpu`]) against its twin:
/// random 64-bit columns with NULLs, a few programs, one that overflows.
fn row_filter_check(gpu: &Gpu, rng: &mut tests_data::Rng) -> Result<usize> {
    let (lit, ins) = (|v: i64| Instr::new(op::LIT, 0, v as u64), |o: u32, arg: u32| Instr::new(o, arg, 0));
    let col = |c: u32| Instr::new(op::COL, c, 0);
    let programs: Vec<Vec<Instr>> = vec![
        vec![col(0), col(1), ins(op::LT_I, 0)],
        vec![
            col(0),
            col(1),
            ins(op::ADD_I, RANGE_I64),
            col(2),
            ins(op::GT_I, 0),
            col(2),
            ins(op::IS_NULL, 0),
            ins(op::OR, 0),
        ],
        vec![col(0), lit(5), ins(op::EQ_I, 0), ins(op::NOT, 0), col(1), ins(op::IS_NOT_NULL, 0), ins(op::AND, 0)],
        vec![col(2), lit(1 << 40), ins(op::MUL_I, 3), lit(0), ins(op::GT_I, 0)],
        // Column 3 is held as bits on the device (a mark), as lanes by the twin.
        vec![col(3), ins(op::NOT, 0), col(0), lit(3), ins(op::GT_I, 0), ins(op::OR, 0)],
        vec![col(3), col(1), lit(0), ins(op::LT_I, 0), ins(op::AND, 0)],
    ];
    let mut checked = 0;
    for n in [0usize, 1, 31, 33, 5000] {
        let columns: Vec<(Vec<u64>, Option<Vec<u32>>)> = (0..3)
            .map(|c| {
                let values: Vec<u64> = (0..n).map(|_| (rng.below(40) as i64 - 20) as u64).collect();
                let valid =
                    (c != 1).then(|| (0..n.div_ceil(32)).map(|_| rng.next_u64() as u32 | 0x0101_0101).collect());
                (values, valid)
            })
            .collect();
        // The bit column: bits and validity words, its lanes for the twin.
        let mark_words: Vec<u32> = (0..n.div_ceil(32)).map(|_| rng.next_u64() as u32).collect();
        let mark_valid: Vec<u32> = (0..n.div_ceil(32)).map(|_| rng.next_u64() as u32 | 0x0303_0303).collect();
        let mark_lanes: Vec<u64> = (0..n).map(|r| (mark_words[r / 32] >> (r % 32)) as u64 & 1).collect();
        let mut host: Vec<RowColumn> =
            columns.iter().map(|(v, b)| RowColumn { values: v, validity: b.as_deref() }).collect();
        host.push(RowColumn { values: &mark_lanes, validity: Some(&mark_valid) });
        let mut stats = TransferStats::default();
        let one = |w: &[u32]| if w.is_empty() { vec![0u32] } else { w.to_vec() };
        let d_mark = gpu.upload(&one(&mark_words), &mut stats)?;
        let d_mark_valid = gpu.upload(&one(&mark_valid), &mut stats)?;
        let bit_refs = [(&d_mark, (n > 0).then_some(&d_mark_valid))];
        let device: Vec<(DeviceBuffer<u64>, Option<DeviceBuffer<u32>>)> = columns
            .iter()
            .map(|(v, b)| {
                let values = gpu.upload(if v.is_empty() { &[0u64][..] } else { v }, &mut stats)?;
                let valid = match b {
                    Some(b) if !b.is_empty() => Some(gpu.upload(b, &mut stats)?),
                    _ => None,
                };
                Ok((values, valid))
            })
            .collect::<Result<_>>()?;
        let refs: Vec<(&DeviceBuffer<u64>, Option<&DeviceBuffer<u32>>)> =
            device.iter().map(|(v, b)| (v, if n == 0 { None } else { b.as_ref() })).collect();
        let host: Vec<RowColumn> =
            host.into_iter().map(|c| if n == 0 { RowColumn { validity: None, ..c } } else { c }).collect();
        for (i, prog) in programs.iter().enumerate() {
            let cpu = pass_rows_cpu(&host, n, prog)?;
            let dev = match pass_rows_gpu(gpu, &refs, &bit_refs, n, prog, &mut stats)? {
                Some(bits) => Some(gpu.download(&bits, n.div_ceil(32), &mut stats)?),
                None => None,
            };
            if cpu != dev {
                return Err(DataFusionError::Execution(format!(
                    "join_filter: row filter {i} over {n} rows differs from the CPU twin"
                )));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::tests_data::*;
    use super::*;

    /// Brute force: every (probe, build) pair with equal non-NULL keys.
    fn brute(j: &PairJoin<'_>, pk: &[Option<i64>], bk: &[Option<i64>]) -> Vec<u8> {
        let cols: Vec<HostColumn> = j.columns.iter().map(HostColumn::of).collect();
        let mut error = false;
        (0..j.n)
            .map(|p| {
                let mut f = 0;
                for b in 0..j.nb {
                    let same = j.keys.is_none() || (pk[p].is_some() && pk[p] == bk[b]);
                    if same {
                        f |= pair_facts(j.programs, &cols, p, b, &mut error);
                    }
                }
                // A matched row stops early: it may not have seen a later NULL.
                if f & MATCHED != 0 {
                    f & (NONEMPTY | MATCHED)
                } else {
                    f
                }
            })
            .collect()
    }

    fn strip_null_after_match(f: Vec<u8>) -> Vec<u8> {
        f.into_iter().map(|x| if x & MATCHED != 0 { x & (NONEMPTY | MATCHED) } else { x }).collect()
    }

    #[test]
    fn groups_and_facts_match_brute_force() {
        let mut rng = Rng(42);
        for (n, nb, span, batch) in
            [(0, 10, 5, 3), (10, 0, 5, 3), (300, 400, 50, 64), (200, 300, 3, 7), (50, 2000, 1, 1000)]
        {
            let pk: Vec<Option<i64>> =
                (0..n).map(|_| (rng.below(8) != 0).then(|| rng.below(span) as i64 - 1)).collect();
            let bk: Vec<Option<i64>> =
                (0..nb).map(|_| (rng.below(8) != 0).then(|| rng.below(span) as i64 - 1)).collect();
            let (probe, build) = (keys(&pk, batch), keys(&bk, batch + 1));
            let g = groups_cpu(&probe, &build).unwrap();
            for p in 0..n {
                let (lo, hi) = g.ranges[p];
                let mut got: Vec<u32> = g.rows[lo as usize..hi as usize].to_vec();
                got.sort();
                let want: Vec<u32> = (0..nb as u32).filter(|&b| pk[p].is_some() && pk[p] == bk[b as usize]).collect();
                assert_eq!(got, want, "group of probe row {p}");
            }
            let mut cols = columns(&mut rng, n, true, true, batch);
            cols.extend(columns(&mut rng, nb, false, true, batch + 1));
            for (name, programs) in programs() {
                for keyed in [true, false] {
                    let j = PairJoin {
                        keys: keyed.then_some((&probe, &build)),
                        n,
                        nb,
                        columns: &cols,
                        programs: &programs,
                    };
                    let got = facts_cpu(&j).unwrap().expect("no overflow");
                    assert_eq!(strip_null_after_match(got), brute(&j, &pk, &bk), "{name}, keys {keyed}, {n} x {nb}");
                }
            }
        }
    }

    #[test]
    fn three_valued_logic_and_float_order() {
        // One probe row, one build row, literal-only programs.
        let lit = |v: u64| Instr::new(op::LIT, 0, v);
        let null = Instr::new(op::NULL, 0, 0);
        let bin = |o: u32| Instr::new(o, 0, 0);
        let cases: Vec<(Vec<Instr>, bool)> = vec![
            (vec![null, lit(0), bin(op::AND)], false), // NULL AND FALSE = FALSE
            (vec![null, lit(0), bin(op::AND), bin(op::NOT)], true),
            (vec![null, lit(1), bin(op::AND), bin(op::IS_NULL)], true), // NULL AND TRUE = NULL
            (vec![null, lit(1), bin(op::OR)], true),                    // NULL OR TRUE = TRUE
            (vec![null, lit(0), bin(op::OR), bin(op::IS_NULL)], true),
            (vec![null, bin(op::NOT), bin(op::IS_NULL)], true),
            (vec![lit(f64::NAN.to_bits()), lit(f64::NAN.to_bits()), bin(op::EQ_F)], true), // Arrow: NaN = NaN
            (vec![lit(f64::NAN.to_bits()), lit(f64::INFINITY.to_bits()), bin(op::GT_F)], true),
            // DataFusion's order: -0.0 = 0.0; NaNs equal bit for bit, -NaN below everything.
            (vec![lit((-0.0f64).to_bits()), lit(0.0f64.to_bits()), bin(op::LT_F)], false),
            (vec![lit((-0.0f64).to_bits()), lit(0.0f64.to_bits()), bin(op::EQ_F)], true),
            (vec![lit(0.0f64.to_bits()), lit((-0.0f64).to_bits()), bin(op::GE_F)], true),
            (vec![lit((-f64::NAN).to_bits()), lit(f64::NAN.to_bits()), bin(op::EQ_F)], false),
            (vec![lit((-f64::NAN).to_bits()), lit(f64::NEG_INFINITY.to_bits()), bin(op::LT_F)], true),
            (vec![lit((-1.5f64).to_bits()), lit((-0.0f64).to_bits()), bin(op::LT_F)], true),
            (vec![lit(5), null, bin(op::LT_I), bin(op::IS_NOT_NULL)], false),
            (vec![lit((-3i64) as u64), lit(2), bin(op::LT_I)], true),
        ];
        let j_cols: Vec<HostColumn> = Vec::new();
        for (i, (prog, want)) in cases.into_iter().enumerate() {
            let mut error = false;
            assert_eq!(eval(&prog, &j_cols, 0, 0, &mut error), want, "case {i}");
            assert!(!error);
        }
        // Checked ranges: i32 overflow, decimal precision.
        let mut error = false;
        eval(&[lit(i32::MAX as u64), lit(1), Instr::new(op::ADD_I, 3, 0)], &j_cols, 0, 0, &mut error);
        assert!(error);
        let mut error = false;
        eval(&[lit(99_999), Instr::new(op::SCALE_I, RANGE_DEC + 6, 10)], &j_cols, 0, 0, &mut error);
        assert!(!error, "999990 fits 6 digits");
        eval(&[lit(99_999), Instr::new(op::SCALE_I, RANGE_DEC + 5, 10)], &j_cols, 0, 0, &mut error);
        assert!(error, "999990 does not fit 5 digits");
    }

    /// 100 x 100 rows in groups of 20 whose u32 products overflow i32.
    fn overflowing_join(seed: u64) -> (KeyColumns, KeyColumns, Vec<PairColumn>, Programs) {
        let mut rng = Rng(seed);
        let pk: Vec<Option<i64>> = (0..100).map(|i| Some(i as i64 % 5)).collect();
        let mut cols = columns(&mut rng, 100, true, false, 30);
        cols.extend(columns(&mut rng, 100, false, false, 40));
        (keys(&pk, 30), keys(&pk, 40), cols, overflowing())
    }

    #[test]
    fn row_filter_follows_sql_rules() {
        // Rows: (a, b) = (1, 2), (3, NULL), (NULL, 0), (5, 5), and 36 more of (i, 40 - i).
        let mut a: Vec<u64> = vec![1, 3, 0, 5];
        let mut b: Vec<u64> = vec![2, 0, 0, 5];
        a.extend((4..40).map(|i| i as u64));
        b.extend((4..40).map(|i| (40 - i) as u64));
        let valid_a = vec![!(1u32 << 2), u32::MAX];
        let valid_b = vec![!(1u32 << 1), u32::MAX];
        let cols = [
            RowColumn { values: &a, validity: Some(&valid_a[..]) },
            RowColumn { values: &b, validity: Some(&valid_b[..]) },
        ];
        let col = |c: u32| Instr::new(op::COL, c, 0);
        let bin = |o: u32| Instr::new(o, 0, 0);
        let kept = |prog: &[Instr]| -> Vec<usize> {
            let words = pass_rows_cpu(&cols, 40, prog).unwrap().unwrap();
            (0..40).filter(|&r| words[r / 32] >> (r % 32) & 1 == 1).collect()
        };
        // a < b: NULL on rows 1 and 2 (neither kept); 4..20 have i < 40 - i.
        let lt = kept(&[col(0), col(1), bin(op::LT_I)]);
        assert_eq!(lt, [0].into_iter().chain(4..20).collect::<Vec<_>>());
        // NOT (a < b): NULL stays NULL.
        let not = kept(&[col(0), col(1), bin(op::LT_I), bin(op::NOT)]);
        assert_eq!(not, [3].into_iter().chain(20..40).collect::<Vec<_>>());
        // a < b OR b IS NULL: row 1 too.
        let or = kept(&[col(0), col(1), bin(op::LT_I), col(1), bin(op::IS_NULL), bin(op::OR)]);
        assert_eq!(or, [0, 1].into_iter().chain(4..20).collect::<Vec<_>>());
        // A table of no rows; a column shorter than the table is an error.
        assert_eq!(pass_rows_cpu(&[], 0, &[Instr::new(op::LIT, 0, 1)]).unwrap(), Some(vec![]));
        assert!(pass_rows_cpu(&cols, 41, &[col(0), bin(op::IS_NULL)]).is_err());
    }

    #[test]
    fn overflow_gives_none() {
        let (probe, build, cols, programs) = overflowing_join(7);
        let j = PairJoin { keys: Some((&probe, &build)), n: 100, nb: 100, columns: &cols, programs: &programs };
        assert_eq!(facts_cpu(&j).unwrap(), None);
    }

    #[test]
    fn gpu_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lease = gpu.lease(0);
        let msg = self_check(&gpu).unwrap();
        eprintln!("join_filter: {msg}");
        let (probe, build, cols, programs) = overflowing_join(99);
        let j = PairJoin { keys: Some((&probe, &build)), n: 100, nb: 100, columns: &cols, programs: &programs };
        let mut stats = TransferStats::default();
        assert_eq!(facts_gpu(&gpu, &j, &mut stats).unwrap(), None, "device overflow flag");
    }

    /// Probe columns of 64-bit integers large enough to cross PCIe packed
    /// ([`upload_values`]): a range wider than 32 bits and a narrow one, both
    /// with negative values and NULLs, over several batches, beside raw INT
    /// columns and the build side's small raw ones; the device's facts are the twin's.
    #[test]
    fn packed_value_columns_match_cpu_twin() {
        use datafusion::arrow::array::{Int32Array, Int64Array};
        use std::sync::Arc;
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let _lease = gpu.lease(0);
        let mut rng = tests_data::Rng(0xFACE_0FF);
        let (n, nb, batch) = (200_000usize, 3_000usize, 65_536usize);
        let mut key = |count: usize| -> Vec<Option<i64>> {
            (0..count).map(|_| (rng.below(20) != 0).then(|| rng.below(1000) as i64)).collect()
        };
        let (pk, bk) = (key(n), key(nb));
        let (probe, build) = (tests_data::keys(&pk, batch), tests_data::keys(&bk, 1000));
        let mut rng = tests_data::Rng(0xBEEF);
        let mut side = |from_probe: bool, count: usize| -> Vec<PairColumn> {
            let mut wide = Vec::new();
            let mut narrow = Vec::new();
            let mut small = Vec::new();
            for start in (0..count).step_by(batch) {
                let len = batch.min(count - start);
                let mut draw = |f: &mut dyn FnMut(&mut tests_data::Rng) -> i64| -> Vec<Option<i64>> {
                    (0..len).map(|_| (rng.below(10) != 0).then(|| f(&mut rng))).collect()
                };
                wide.push(
                    Arc::new(Int64Array::from(draw(&mut |r| (r.next_u64() >> 20) as i64 - (1 << 43)))) as ArrayRef
                );
                narrow.push(Arc::new(Int64Array::from(draw(&mut |r| r.below(1 << 20) as i64 - 500_000))) as ArrayRef);
                let ints: Vec<Option<i32>> =
                    draw(&mut |r| r.below(100) as i64 - 50).iter().map(|v| v.map(|v| v as i32)).collect();
                small.push(Arc::new(Int32Array::from(ints)) as ArrayRef);
            }
            [wide, narrow, small].iter().map(|a| PairColumn::new(from_probe, a).unwrap()).collect()
        };
        let mut cols = side(true, n);
        cols.extend(side(false, nb));
        let col = |i: u32| Instr::new(op::COL, i, 0);
        // probe.wide < build.wide OR probe.narrow + build.narrow > probe.small
        let filter = vec![
            col(0),
            col(3),
            Instr::new(op::LT_I, 0, 0),
            col(1),
            col(4),
            Instr::new(op::ADD_I, RANGE_I64, 0),
            col(2),
            Instr::new(op::GT_I, 0, 0),
            Instr::new(op::OR, 0, 0),
        ];
        let programs = Programs { filter, in_keys: None };
        let j = PairJoin { keys: Some((&probe, &build)), n, nb, columns: &cols, programs: &programs };
        let mut stats = TransferStats::default();
        let got = facts_gpu(&gpu, &j, &mut stats).unwrap();
        assert_eq!(got, facts_cpu(&j).unwrap());
        assert!(got.unwrap().iter().any(|&f| f & NONEMPTY != 0));
        // The narrow probe column crossed as 4-byte offsets: the values and the probe's 4-byte packed
        // keys (and the small rest) take fewer bytes than the raw values and half those keys.
        let raw: usize = cols.iter().flat_map(|c| c.values.iter().map(|b| b.len())).sum();
        assert!(stats.bytes_to_device < raw + n * 2, "{} bytes for {raw} raw", stats.bytes_to_device);
    }
}
