//! The seeds' GPU library baselines: CUB's radix sort and thrust's sort and
//! set operations (`benches/cuda/seed_baselines.cu`), built with nvcc once a
//! full run starts and kept as one child process that takes one job a line.
//! Keys travel to it through files in a temporary folder. Where nvcc or a
//! GPU is missing (or with `--quick`), the rows leave these figures out and
//! the run's first lines say why.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use datafusion::error::{DataFusionError, Result};

/// The harness's source, written beside its binary at build time (so a
/// bundle of the command needs no checkout beside it).
const SOURCE: &str = include_str!("../../../../benches/cuda/seed_baselines.cu");

/// One baseline's medians: the inputs already on the device, and from host
/// memory to the result in host memory (allocations included).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub device_ms: f64,
    pub total_ms: f64,
}

impl Timing {
    /// "12.34 ms (3.21 ms on the device)".
    pub fn show(&self) -> String {
        format!("{} ({} on the device)", super::ms(self.total_ms), super::ms(self.device_ms))
    }
}

/// CUB's and thrust's sorts of one key column.
pub(crate) struct SortTimes {
    pub cub: Timing,
    pub thrust: Timing,
    /// Both results were the keys in order (each value at its key's index).
    pub ok: bool,
}

/// The harness, started; its jobs run one at a time.
pub(crate) struct CudaBaselines {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
    files: usize,
    pub device: String,
}

/// The nvcc to build with: `SETFUSION_NVCC`, else `nvcc` on the PATH, else CUDA's default place.
fn nvcc() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("SETFUSION_NVCC").map(PathBuf::from),
        Some(PathBuf::from("nvcc")),
        Some(PathBuf::from("/usr/local/cuda/bin/nvcc")),
    ];
    candidates.into_iter().flatten().find(|c| {
        Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    })
}

impl CudaBaselines {
    /// Build and start the harness (`runs` timed runs per figure); the reason when it cannot.
    pub fn start(runs: usize) -> std::result::Result<CudaBaselines, String> {
        let nvcc = nvcc().ok_or("no nvcc (set SETFUSION_NVCC) to build benches/cuda/seed_baselines.cu")?;
        let dir = std::env::temp_dir().join(format!("setfusion-seed-baselines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let src = dir.join("seed_baselines.cu");
        std::fs::write(&src, SOURCE).map_err(|e| format!("{}: {e}", src.display()))?;
        let bin = dir.join("seed_baselines");
        let t = std::time::Instant::now();
        let out = Command::new(&nvcc)
            .args(["-O3", "-std=c++17", "-arch=native", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .map_err(|e| format!("{}: {e}", nvcc.display()))?;
        if !out.status.success() {
            let log = String::from_utf8_lossy(&out.stderr);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!("nvcc failed: {}", log.lines().take(6).collect::<Vec<_>>().join(" / ")));
        }
        eprintln!("bench seeds: thrust / CUB baselines built in {:.1} s", t.elapsed().as_secs_f64());
        let mut child = Command::new(&bin)
            .arg(runs.max(1).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the harness's pipes".into());
        };
        let mut harness =
            CudaBaselines { child, stdin, stdout: BufReader::new(stdout), dir, files: 0, device: String::new() };
        let ready = harness.answer().map_err(|e| e.to_string())?;
        harness.device = ready.strip_prefix("ready device=").unwrap_or(&ready).to_string();
        Ok(harness)
    }

    /// The harness's next line; its error lines become errors.
    fn answer(&mut self) -> Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        let line = line.trim_end().to_string();
        if line.is_empty() {
            return Err(DataFusionError::Execution("bench seeds: the thrust / CUB harness ended".into()));
        }
        if let Some(e) = line.strip_prefix("error ") {
            return Err(DataFusionError::Execution(format!("bench seeds: thrust / CUB harness: {e}")));
        }
        Ok(line)
    }

    /// Send `job`; the answer's `key=value` fields.
    fn job(&mut self, job: &str) -> Result<Vec<(String, String)>> {
        writeln!(self.stdin, "{job}")?;
        self.stdin.flush()?;
        let line = self.answer()?;
        Ok(line.split_whitespace().filter_map(|f| f.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect())
    }

    /// `keys` as little-endian bytes in a fresh file of the folder.
    fn write<T: Key>(&mut self, keys: &[T]) -> Result<PathBuf> {
        self.files += 1;
        let path = self.dir.join(format!("keys-{}.bin", self.files));
        let mut bytes = Vec::with_capacity(keys.len() * T::WIDTH);
        keys.iter().for_each(|k| k.put(&mut bytes));
        std::fs::write(&path, bytes)?;
        Ok(path)
    }

    /// CUB's and thrust's sorts of `keys` (with `pairs`, of (key, index) pairs).
    pub fn sort(&mut self, keys: &[u32], pairs: bool) -> Result<SortTimes> {
        let path = self.write(keys)?;
        let f = self.job(&format!("sort {} {}", u8::from(pairs), path.display()))?;
        let _ = std::fs::remove_file(&path);
        Ok(SortTimes {
            cub: Timing { device_ms: number(&f, "cub_device_ms")?, total_ms: number(&f, "cub_total_ms")? },
            thrust: Timing { device_ms: number(&f, "thrust_device_ms")?, total_ms: number(&f, "thrust_total_ms")? },
            ok: number(&f, "ok")? == 1.0,
        })
    }

    /// thrust's `op` (`intersection`, `difference`, `union`,
    /// `symmetric_difference`) of `a` and `b`, sorted first by thrust unless
    /// `sorted`: the result's length and its times.
    pub fn set_op<T: Key>(&mut self, op: &str, sorted: bool, a: &[T], b: &[T]) -> Result<(u64, Timing)> {
        let (pa, pb) = (self.write(a)?, self.write(b)?);
        let job = format!("set {op} {} {} {} {}", u8::from(sorted), T::WIDTH, pa.display(), pb.display());
        let f = self.job(&job)?;
        let _ = (std::fs::remove_file(&pa), std::fs::remove_file(&pb));
        if number(&f, "ok")? != 1.0 {
            return Err(DataFusionError::Execution(format!("bench seeds: thrust's {op} counted unevenly")));
        }
        let timing = Timing { device_ms: number(&f, "device_ms")?, total_ms: number(&f, "total_ms")? };
        Ok((number(&f, "count")? as u64, timing))
    }
}

impl Drop for CudaBaselines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The field `key` of an answer, as a number.
fn number(fields: &[(String, String)], key: &str) -> Result<f64> {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| DataFusionError::Execution(format!("bench seeds: the thrust / CUB harness gave no {key}")))
}

/// A key type the harness takes: u32 (width 4) or u64 (width 8).
pub(crate) trait Key: Copy {
    const WIDTH: usize;
    fn put(self, out: &mut Vec<u8>);
}

impl Key for u32 {
    const WIDTH: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Key for u64 {
    const WIDTH: usize = 8;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}
