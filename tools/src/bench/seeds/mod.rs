//! `setfusion bench seeds [--quick] [--seeds 000,..] [--runs N]`: the
//! benchmark cases of the five seed documents (`../shared/seeds/`, their
//! digests' "BENCHMARK CASES TO REPRODUCE"), run on setfusion's own code
//! paths beside the baselines the seeds name, one markdown table per seed:
//! the case, the paper's figure and its hardware, setfusion's figure on this
//! machine, the ratio where a hardware-independent one means something, and
//! whether setfusion's answers match the baselines' (or the answer known by
//! construction).
//!
//! Timing follows the seeds: GPU times run from the first upload until the
//! result is in host memory (transfers and allocations included, kernel
//! compilation excluded by an untimed first run); CPU baselines run on one
//! thread as the papers' did, except where a seed names a parallel one.
//!
//! `--quick` runs small sizes in well under a minute, on the CPU twins alone
//! when there is no GPU (CI); every answer is still checked, and a mismatch
//! fails the run. Cases that cannot run say why in their row.

use std::time::Instant;

use datafusion::error::{DataFusionError, Result};

mod cuda_baselines;
mod seed000_families;
mod seed001_strategies;
mod seed002_multisets;
mod seed003_gtwj;
mod seed004_large_sets;

pub use seed004_large_sets::simd_count;

/// `setfusion bench seeds`' options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Small sizes only, in well under a minute (CI runs this; CPU twins alone without a GPU)
    #[arg(long)]
    pub quick: bool,
    /// Which seeds' cases to run
    #[arg(long, value_name = "NNN,..", value_delimiter = ',', default_values = ["000", "001", "002", "003", "004"])]
    pub seeds: Vec<String>,
    /// Timed runs per measurement (the median); 0 counts as 1. --quick runs once.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub runs: usize,
    /// Use the CPU twins only, even where a GPU is present
    #[arg(long)]
    pub cpu_only: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            quick: false,
            seeds: ["000", "001", "002", "003", "004"].map(String::from).to_vec(),
            runs: 3,
            cpu_only: false,
        }
    }
}

/// What the cases of one run share: the device (None: CPU twins only), the
/// size regime, the runs per measurement, and the thrust / CUB harness.
pub(crate) struct Bench {
    pub gpu: Option<std::sync::Arc<setfusion::gpu::Gpu>>,
    pub quick: bool,
    pub runs: usize,
    cuda: std::sync::Mutex<Option<cuda_baselines::CudaBaselines>>,
    /// Where the thrust / CUB figures come from, or why there are none.
    pub cuda_note: String,
}

impl Bench {
    /// The median of `runs` timed calls of `f` in milliseconds, and the last
    /// call's result. With `warm_up`, one untimed call first (the first
    /// device call compiles its kernels, which the seeds' timings exclude).
    pub fn time<T>(&self, warm_up: bool, mut f: impl FnMut() -> Result<T>) -> Result<(f64, T)> {
        if warm_up && !self.quick {
            f()?;
        }
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..self.runs.max(1) {
            let t = Instant::now();
            last = Some(f()?);
            times.push(t.elapsed());
        }
        Ok((super::median(times).as_secs_f64() * 1e3, last.expect("at least one run")))
    }

    /// [`Bench::time`] of `f` over a fresh input from `setup` each call (the
    /// setup, e.g. a copy to sort in place, is not timed).
    pub fn time_each<S, T>(&self, mut setup: impl FnMut() -> S, mut f: impl FnMut(S) -> Result<T>) -> Result<(f64, T)> {
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..self.runs.max(1) {
            let input = setup();
            let t = Instant::now();
            last = Some(f(input)?);
            times.push(t.elapsed());
        }
        Ok((super::median(times).as_secs_f64() * 1e3, last.expect("at least one run")))
    }

    /// `f` with the thrust / CUB harness, when it runs (not with `--quick`,
    /// without a GPU or without nvcc).
    pub fn with_cuda<T>(&self, f: impl FnOnce(&mut cuda_baselines::CudaBaselines) -> Result<T>) -> Option<Result<T>> {
        let mut harness = self.cuda.lock().unwrap_or_else(|p| p.into_inner());
        harness.as_mut().map(f)
    }

    /// `f` with the device held (a lease without a memory limit), when there is one.
    pub fn on_gpu<T>(&self, f: impl FnOnce(&setfusion::gpu::Gpu) -> Result<T>) -> Option<Result<T>> {
        self.gpu.as_ref().map(|g| {
            let lease = g.lease(0);
            f(&lease)
        })
    }
}

/// Whether setfusion's answers agreed with the baselines'.
#[derive(Debug, Clone, PartialEq)]
pub enum Answers {
    Match,
    /// What differed (fails the run).
    Differ(String),
    /// Nothing to compare (a case that did not run, or times alone).
    Unchecked,
}

impl Answers {
    /// Match when `ok`, else Differ with `what`.
    pub fn check(ok: bool, what: impl FnOnce() -> String) -> Answers {
        if ok {
            Answers::Match
        } else {
            Answers::Differ(what())
        }
    }

    /// Both must match.
    pub fn and(self, other: Answers) -> Answers {
        match (self, other) {
            (Answers::Differ(a), _) => Answers::Differ(a),
            (_, Answers::Differ(b)) => Answers::Differ(b),
            (Answers::Match, _) | (_, Answers::Match) => Answers::Match,
            _ => Answers::Unchecked,
        }
    }
}

/// One case's row.
#[derive(Debug, Clone)]
pub struct Row {
    pub case: String,
    /// The paper's figure and its hardware.
    pub paper: String,
    /// setfusion's figure on this machine, or "not run: <why>".
    pub ours: String,
    pub ratio: String,
    pub answers: Answers,
}

impl Row {
    pub fn new(case: impl Into<String>, paper: impl Into<String>, ours: impl Into<String>) -> Row {
        Row {
            case: case.into(),
            paper: paper.into(),
            ours: ours.into(),
            ratio: "-".into(),
            answers: Answers::Unchecked,
        }
    }

    pub fn ratio(mut self, ratio: impl Into<String>) -> Row {
        self.ratio = ratio.into();
        self
    }

    pub fn answers(mut self, answers: Answers) -> Row {
        self.answers = answers;
        self
    }

    /// A case that does not run here, and why.
    pub fn not_run(case: impl Into<String>, paper: impl Into<String>, why: impl std::fmt::Display) -> Row {
        Row::new(case, paper, format!("not run: {why}"))
    }
}

/// One seed's table.
pub struct Table {
    pub title: String,
    /// The data recipe and the parameters the seed leaves open.
    pub notes: Vec<String>,
    pub rows: Vec<Row>,
}

impl Table {
    pub fn new(title: impl Into<String>) -> Table {
        Table { title: title.into(), notes: Vec::new(), rows: Vec::new() }
    }

    pub fn markdown(&self) -> String {
        let mut s = format!("### {}\n\n", self.title);
        for n in &self.notes {
            s += &format!("- {n}\n");
        }
        if !self.notes.is_empty() {
            s += "\n";
        }
        s +=
            "| case | the paper (its hardware) | setfusion (this machine) | ratio | answers |\n|---|---|---|---|---|\n";
        for r in &self.rows {
            let answers = match &r.answers {
                Answers::Match => "match".to_string(),
                Answers::Differ(what) => format!("**DIFFER**: {what}"),
                Answers::Unchecked => "-".to_string(),
            };
            s += &format!("| {} | {} | {} | {} | {} |\n", r.case, r.paper, r.ours, r.ratio, answers);
        }
        s
    }
}

/// Run a future to completion on a runtime of its own (the seeds run on a
/// plain thread; the SQL cases need a runtime).
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime").block_on(f)
}

/// Milliseconds as a table shows them.
pub(crate) fn ms(t: f64) -> String {
    if t >= 100.0 {
        format!("{t:.0} ms")
    } else if t >= 1.0 {
        format!("{t:.2} ms")
    } else {
        format!("{:.1} µs", t * 1e3)
    }
}

/// `a / b` as a speedup ("2.31x").
pub(crate) fn times(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

/// Every seed's table for `options`; an error if an answer differed.
pub fn tables(options: &Options) -> Result<Vec<Table>> {
    let gpu = if options.cpu_only { None } else { setfusion::gpu::gpu(0).ok() };
    let runs = if options.quick { 1 } else { options.runs.max(1) };
    let cuda = match (&gpu, options.quick) {
        (None, _) if options.cpu_only => Err("--cpu-only".to_string()),
        (None, _) => Err("no GPU".to_string()),
        (Some(_), true) => Err("--quick".to_string()),
        (Some(_), false) => cuda_baselines::CudaBaselines::start(runs),
    };
    let cuda_note = match &cuda {
        Ok(h) => format!(
            "thrust / CUB: `benches/cuda/seed_baselines.cu` built by nvcc for {}; \"total\" from host memory to \
             the result in host memory (allocations, uploads, download), \"on the device\" the inputs already there",
            h.device
        ),
        Err(why) => format!("thrust / CUB baselines not run: {why}"),
    };
    let b = Bench { gpu, quick: options.quick, runs, cuda: std::sync::Mutex::new(cuda.ok()), cuda_note };
    let mut out = Vec::new();
    for seed in &options.seeds {
        out.push(match seed.as_str() {
            "000" => seed000_families::table(&b)?,
            "001" => seed001_strategies::table(&b)?,
            "002" => seed002_multisets::table(&b)?,
            "003" => seed003_gtwj::table(&b)?,
            "004" => seed004_large_sets::table(&b)?,
            other => return Err(DataFusionError::Plan(format!("bench seeds: no seed {other} (000 to 004)"))),
        });
    }
    Ok(out)
}

pub fn run(options: Options) -> Result<()> {
    let started = Instant::now();
    let gpu = if options.cpu_only { None } else { setfusion::gpu::gpu(0).ok() };
    match &gpu {
        Some(g) => println!("device: {} ({} host threads)", g.info().name, setfusion::host::copy_threads()),
        None => println!("no GPU (or --cpu-only): the CPU twins alone; GPU columns say so"),
    }
    drop(gpu);
    let tables = tables(&options)?;
    let mut differ = Vec::new();
    for t in &tables {
        println!("{}", t.markdown());
        differ.extend(t.rows.iter().filter(|r| matches!(r.answers, Answers::Differ(_))).map(|r| r.case.clone()));
    }
    println!("bench seeds: {:.1} s", started.elapsed().as_secs_f64());
    if differ.is_empty() {
        Ok(())
    } else {
        Err(DataFusionError::Execution(format!("bench seeds: answers differ in {}", differ.join(", "))))
    }
}

/// Data recipes the seeds share.
pub mod data {
    /// A bijection of u32 (murmur3's finaliser): distinct inputs give
    /// distinct, well-spread outputs.
    pub fn mix32(mut x: u32) -> u32 {
        x ^= x >> 16;
        x = x.wrapping_mul(0x85eb_ca6b);
        x ^= x >> 13;
        x = x.wrapping_mul(0xc2b2_ae35);
        x ^ (x >> 16)
    }

    /// `mix32(from..to)`: unique, unsorted keys (seed 001's LFSR sets), filled in parallel.
    pub fn unique_u32(from: u32, to: u32) -> Vec<u32> {
        let mut v: Vec<u32> = vec![0; (to - from) as usize];
        let chunk = v.len().div_ceil(64).max(1 << 16);
        let mut parts: Vec<(usize, &mut [u32])> =
            v.chunks_mut(chunk).enumerate().map(|(i, c)| (i * chunk, c)).collect();
        setfusion::host::for_each_mut(&mut parts, &|_, (at, c)| {
            for (j, x) in c.iter_mut().enumerate() {
                *x = mix32(from + (*at + j) as u32);
            }
        });
        v
    }

    /// Two sets of `n` unique keys of which `common` are in both: A =
    /// mix32(0..n), B = mix32(n - common..2n - common).
    pub fn overlapping_pair(n: usize, common: usize) -> (Vec<u32>, Vec<u32>) {
        let a = unique_u32(0, n as u32);
        let b = unique_u32((n - common) as u32, (2 * n - common) as u32);
        (a, b)
    }

    /// Two sets of sizes `na` and `nb` sharing `common` keys.
    pub fn overlapping_sizes(na: usize, nb: usize, common: usize) -> (Vec<u32>, Vec<u32>) {
        let a = unique_u32(0, na as u32);
        let b = unique_u32((na - common) as u32, (na + nb - common) as u32);
        (a, b)
    }

    /// xorshift64*: a small, seeded, platform-independent generator.
    pub struct Rng(u64);

    impl Rng {
        pub fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
        }

        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        /// Uniform in [0, 1).
        pub fn unit(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
        }

        pub fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n.max(1)
        }
    }

    /// How seed 004's artificial sets draw their elements over a universe E.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub enum Dist {
        /// Normal, mean E / 2, standard deviation E / 8 (clipped to E).
        Normal,
        Uniform,
        /// Zipf with exponent 1, continuous: x = floor(E^u) - 1, u uniform,
        /// so P(x) ~ 1 / (x + 1); the small elements are in nearly every set.
        Zipf,
    }

    impl Dist {
        pub fn name(self) -> &'static str {
            match self {
                Dist::Normal => "norm",
                Dist::Uniform => "uni",
                Dist::Zipf => "zipf",
            }
        }

        fn draw(self, rng: &mut Rng, universe: u64) -> u64 {
            let e = universe as f64;
            let x = match self {
                Dist::Uniform => return rng.below(universe),
                Dist::Normal => {
                    // Box-Muller.
                    let (u1, u2) = (rng.unit().max(1e-300), rng.unit());
                    e / 2.0 + e / 8.0 * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
                }
                Dist::Zipf => e.powf(rng.unit()) - 1.0,
            };
            (x.max(0.0) as u64).min(universe - 1)
        }
    }

    /// `n` distinct elements of [0, universe) drawn from `dist`, ascending
    /// (drawn until `n` are distinct, kept in a bitmap of the universe).
    pub fn sorted_set(dist: Dist, universe: u64, n: usize, seed: u64) -> Vec<u32> {
        assert!(universe <= 1 << 32 && n as u64 <= universe / 2, "{n} of {universe}");
        let mut bits = vec![0u64; universe.div_ceil(64) as usize];
        let mut rng = Rng::new(seed);
        let mut have = 0;
        while have < n {
            let x = dist.draw(&mut rng, universe);
            let (w, b) = ((x / 64) as usize, x % 64);
            if bits[w] >> b & 1 == 0 {
                bits[w] |= 1 << b;
                have += 1;
            }
        }
        let mut out = Vec::with_capacity(n);
        for (w, &word) in bits.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                out.push((w as u64 * 64 + word.trailing_zeros() as u64) as u32);
                word &= word - 1;
            }
        }
        out
    }

    /// u32 keys in setfusion's u64 key layout, on the host's threads.
    pub fn widen(v: &[u32]) -> Vec<u64> {
        let mut out = vec![0u64; v.len()];
        let chunk = v.len().div_ceil(64).max(1 << 16);
        let mut parts: Vec<(usize, &mut [u64])> =
            out.chunks_mut(chunk).enumerate().map(|(i, c)| (i * chunk, c)).collect();
        setfusion::host::for_each_mut(&mut parts, &|_, (at, c)| {
            c.iter_mut().zip(&v[*at..]).for_each(|(o, &x)| *o = x as u64);
        });
        out
    }

    /// A parallel sort standing in for tbb::parallel_sort: runs sorted on the
    /// host's threads, then merged pairwise, a round at a time, in parallel.
    pub fn parallel_sort<T: Copy + Ord + Send + Sync + Default>(v: &mut Vec<T>) {
        let threads = setfusion::host::copy_threads().max(1);
        let run = v.len().div_ceil(threads).max(1 << 14);
        let mut runs: Vec<&mut [T]> = v.chunks_mut(run).collect();
        setfusion::host::for_each_mut(&mut runs, &|_, r| r.sort_unstable());
        let mut width = run;
        let mut src = std::mem::take(v);
        let mut dst = vec![T::default(); src.len()];
        while width < src.len() {
            let pairs: Vec<(&[T], &mut [T])> = src.chunks(2 * width).zip(dst.chunks_mut(2 * width)).collect();
            let mut pairs = pairs;
            setfusion::host::for_each_mut(&mut pairs, &|_, (s, d)| {
                let (a, b) = s.split_at(width.min(s.len()));
                let (mut i, mut j) = (0, 0);
                for slot in d.iter_mut() {
                    if j >= b.len() || (i < a.len() && a[i] <= b[j]) {
                        *slot = a[i];
                        i += 1;
                    } else {
                        *slot = b[j];
                        j += 1;
                    }
                }
            });
            std::mem::swap(&mut src, &mut dst);
            width *= 2;
        }
        *v = src;
    }
}
