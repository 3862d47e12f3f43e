//! The host's and device's measured rates (`setfusion doctor` measures and
//! stores them): the planner's cost model weighs uploads and a fresh
//! process's device start with them, and the similarity join's run-time rule
//! decides with the start whether a device is worth starting at all.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The host's and device's measured rates, as `setfusion doctor` stores them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// Keys uploaded per second through packing and pinned staging, in GB/s of 8-byte keys.
    pub upload_gbps: f64,
    /// A fresh process's device start (context, kernels, staging), ms.
    pub start_ms: f64,
    /// Whether these were measured (false: the defaults).
    pub measured: bool,
}

impl Default for Calibration {
    /// Conservative: the slowest upload seen on the H100 loans (~18 GB/s) and
    /// the start measured before native-code caching (~550 ms).
    fn default() -> Self {
        Self { upload_gbps: 18.0, start_ms: 550.0, measured: false }
    }
}

impl Calibration {
    fn path() -> Option<PathBuf> {
        if let Some(p) = crate::env::calibration_file() {
            return Some(p);
        }
        Some(crate::gpu::setfusion_cache_dir()?.join("calibration.txt"))
    }

    /// The stored calibration (read once per process), or the defaults.
    pub fn current() -> Calibration {
        static CURRENT: OnceLock<Calibration> = OnceLock::new();
        *CURRENT.get_or_init(|| {
            Self::path().and_then(|p| std::fs::read_to_string(p).ok()).map_or_else(Self::default, |t| Self::parse(&t))
        })
    }

    /// `key = value` lines; unknown keys and bad values keep the defaults.
    pub fn parse(text: &str) -> Calibration {
        let mut c = Calibration::default();
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else { continue };
            let Ok(v) = v.trim().parse::<f64>() else { continue };
            if !(v.is_finite() && v > 0.0) {
                continue;
            }
            match k.trim() {
                "upload_gbps" => c.upload_gbps = v,
                "start_ms" => c.start_ms = v,
                _ => continue,
            }
            c.measured = true;
        }
        c
    }

    /// Write the calibration where [`Calibration::current`] finds it; returns the path.
    pub fn save(&self) -> std::io::Result<PathBuf> {
        let p = Self::path().ok_or_else(|| std::io::Error::other("no cache folder (HOME unset)"))?;
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(
            &p,
            format!(
                "# setfusion doctor's measurements\nupload_gbps = {:.2}\nstart_ms = {:.1}\n",
                self.upload_gbps, self.start_ms
            ),
        )?;
        Ok(p)
    }
}
