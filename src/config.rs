//! `setfusion.*` settings, a DataFusion config extension settable from SQL:
//! `SET setfusion.enabled = false`, `SET setfusion.strategy = 'hash'`, ...
//! Invalid values are rejected at `SET` time with a one-line error.

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{ConfigExtension, ConfigField, Visit};
use datafusion::common::extensions_options;
use datafusion::error::{DataFusionError, Result};

/// Which algorithm the operators use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Choose from sizes, key width and value range (GPU when usable).
    #[default]
    Auto,
    /// Force the CPU backend.
    Cpu,
    /// GPU open-addressing hash table.
    Hash,
    /// GPU bitmap / direct-address table on a dense integer domain.
    Bitmap,
    /// GPU radix sort + Balanced Path merge (seed 002).
    Sort,
}

impl FromStr for Strategy {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Strategy::Auto),
            "cpu" => Ok(Strategy::Cpu),
            "hash" => Ok(Strategy::Hash),
            "bitmap" => Ok(Strategy::Bitmap),
            "sort" => Ok(Strategy::Sort),
            other => Err(DataFusionError::Configuration(format!(
                "invalid setfusion.strategy '{other}': expected one of auto, cpu, hash, bitmap, sort"
            ))),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::Auto => "auto",
            Strategy::Cpu => "cpu",
            Strategy::Hash => "hash",
            Strategy::Bitmap => "bitmap",
            Strategy::Sort => "sort",
        })
    }
}

/// A byte count written as `0`, `512M`, `4G`, `1073741824`; 0 means "90% of the device".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteSize(pub usize);

impl FromStr for ByteSize {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().trim_matches('\'').to_ascii_uppercase();
        let t = t.strip_suffix('B').unwrap_or(&t);
        let (num, mul) = match t.chars().last() {
            Some('K') => (&t[..t.len() - 1], 1usize << 10),
            Some('M') => (&t[..t.len() - 1], 1 << 20),
            Some('G') => (&t[..t.len() - 1], 1 << 30),
            Some('T') => (&t[..t.len() - 1], 1 << 40),
            _ => (t, 1),
        };
        num.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| ByteSize((v * mul as f64) as usize))
            .ok_or_else(|| {
                DataFusionError::Configuration(format!(
                    "invalid setfusion.memory_limit '{s}': expected a size such as 0, 512M or 4G"
                ))
            })
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// `setfusion.devices`: which GPUs a large set selection is split across.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Devices {
    /// '' (the default): the one device `setfusion.device`.
    #[default]
    One,
    /// 'all': every device the driver sees.
    All,
    /// '0,1': these ordinals, one key partition each. A repeated ordinal runs
    /// its partitions in turn ('0,0' splits the work on one GPU, which tests
    /// the split where only one GPU is present).
    List(Vec<usize>),
}

impl FromStr for Devices {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().trim_matches('\'').trim();
        if t.is_empty() {
            return Ok(Devices::One);
        }
        if t.eq_ignore_ascii_case("all") {
            return Ok(Devices::All);
        }
        t.split(',')
            .map(|o| o.trim().parse::<usize>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(Devices::List)
            .map_err(|_| DataFusionError::Configuration(format!("invalid setfusion.devices '{s}': expected '', 'all' or device ordinals such as '0,1'")))
    }
}

impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Devices::One => Ok(()),
            Devices::All => write!(f, "all"),
            Devices::List(l) => write!(f, "{}", l.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(",")),
        }
    }
}

macro_rules! parsed_field {
    ($t:ty) => {
        impl ConfigField for $t {
            fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
                v.some(key, self, description)
            }
            fn set(&mut self, _key: &str, value: &str) -> Result<()> {
                *self = value.parse()?;
                Ok(())
            }
            fn reset(&mut self, _key: &str) -> Result<()> {
                *self = Default::default();
                Ok(())
            }
        }
    };
}
parsed_field!(Strategy);
parsed_field!(ByteSize);
parsed_field!(Devices);

extensions_options! {
    /// setfusion settings (`SET setfusion.<name> = <value>`).
    pub struct SetfusionConfig {
        /// Replace DataFusion's set operations and semi/anti joins with setfusion operators.
        pub enabled: bool, default = true
        /// Set operations and semi / anti joins ask for both inputs hash-partitioned on their
        /// keys and decide each partition on its own (a Ballista cluster, where each task sees
        /// one partition: `setfusion::distributed` turns it on). false: one selection over
        /// all input partitions at once (one process, one device sees every row).
        pub hash_partition_inputs: bool, default = false
        /// Inputs with fewer estimated rows than this run on the CPU backend.
        pub min_rows: usize, default = 100_000
        /// auto, cpu, hash or bitmap.
        pub strategy: Strategy, default = Strategy::Auto
        /// Device memory budget in bytes (0 = 90% of the device); larger inputs are partitioned.
        pub memory_limit: ByteSize, default = ByteSize(0)
        /// CUDA device ordinal.
        pub device: usize, default = 0
        /// Several GPUs: '' (only `device`), 'all', or ordinals '0,1'. A large set operation or
        /// semi / anti join is hash-partitioned by key, one partition per listed device.
        pub devices: Devices, default = Devices::One
        /// Output arrays may live in pinned host memory from the device's pool (the kept key
        /// column the device sends back; fixed-width output columns without NULLs): no page
        /// faults, no copy. false: every output array is in ordinary memory (pinned memory
        /// cannot be swapped out, and a caller holding results holds it).
        pub pinned_output: bool, default = true
    }
}

impl ConfigExtension for SetfusionConfig {
    const PREFIX: &'static str = "setfusion";
}

impl SetfusionConfig {
    /// The settings in force for a session (defaults if none were registered).
    pub fn from_options(options: &datafusion::config::ConfigOptions) -> Self {
        options.extensions.get::<SetfusionConfig>().cloned().unwrap_or_default()
    }

    /// The device of each key partition under `setfusion.devices`, with
    /// `count` the devices the driver sees ('all'); one entry means no split.
    pub fn device_ordinals(&self, count: impl FnOnce() -> usize) -> Vec<usize> {
        match &self.devices {
            Devices::One => vec![self.device],
            Devices::All => (0..count().max(1)).collect(),
            Devices::List(l) if l.is_empty() => vec![self.device],
            Devices::List(l) => l.clone(),
        }
    }
}
