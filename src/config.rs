//! `setfusion.*` settings, a DataFusion config extension settable from SQL:
//! `SET setfusion.enabled = false`, `SET setfusion.strategy = 'hash'`, ...
//! Invalid values are rejected at `SET` time with a one-line error.

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{ConfigExtension, ConfigField, Visit};
use datafusion::error::{DataFusionError, Result};

/// Which algorithm the operators use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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
                    "invalid size '{s}' for setfusion.memory_limit, cache_limit or sets_cache_limit: expected a size such as 0, 512M or 4G"
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
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
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
            .map_err(|_| {
                DataFusionError::Configuration(format!(
                    "invalid setfusion.devices '{s}': expected '', 'all' or device ordinals such as '0,1'"
                ))
            })
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

/// DataFusion's `extensions_options!`, except that [`ExtensionOptions::entries`]
/// names each setting with its prefix (`setfusion.strategy`, not
/// `strategy`). A Ballista client sends a session's settings to the scheduler
/// as `entries()`, and the scheduler `SET`s each key: an unprefixed key
/// names no namespace and was dropped, so no `SET setfusion.*` reached the
/// cluster. `SHOW setfusion.strategy` finds the setting for the same reason.
macro_rules! setfusion_settings {
    (
     $(#[doc = $struct_d:tt])*
     $vis:vis struct $struct_name:ident {
        $(
        $(#[doc = $d:tt])*
        $field_vis:vis $field_name:ident : $field_type:ty, default = $default:expr
        )*
    }
    ) => {
        $(#[doc = $struct_d])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        $vis struct $struct_name {
            $(
            $(#[doc = $d])*
            $field_vis $field_name: $field_type,
            )*
        }

        impl Default for $struct_name {
            fn default() -> Self {
                Self { $($field_name: $default),* }
            }
        }

        impl datafusion::common::config::ExtensionOptions for $struct_name {
            fn as_any(&self) -> &dyn std::any::Any {
                self
            }

            fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
                self
            }

            fn cloned(&self) -> Box<dyn datafusion::common::config::ExtensionOptions> {
                Box::new(self.clone())
            }

            fn set(&mut self, key: &str, value: &str) -> Result<()> {
                ConfigField::set(self, key, value)
            }

            fn entries(&self) -> Vec<datafusion::common::config::ConfigEntry> {
                struct Entries(Vec<datafusion::common::config::ConfigEntry>);
                impl Visit for Entries {
                    fn some<V: fmt::Display>(&mut self, key: &str, value: V, description: &'static str) {
                        self.0.push(datafusion::common::config::ConfigEntry { key: key.to_string(), value: Some(value.to_string()), description });
                    }
                    fn none(&mut self, key: &str, description: &'static str) {
                        self.0.push(datafusion::common::config::ConfigEntry { key: key.to_string(), value: None, description });
                    }
                }
                let mut v = Entries(Vec::new());
                ConfigField::visit(self, &mut v, <Self as ConfigExtension>::PREFIX, "");
                v.0
            }
        }

        impl ConfigField for $struct_name {
            fn set(&mut self, key: &str, value: &str) -> Result<()> {
                let (key, rem) = key.split_once('.').unwrap_or((key, ""));
                match key {
                    $(stringify!($field_name) => self.$field_name.set(rem, value),)*
                    _ => Err(DataFusionError::Configuration(format!("Config value \"{key}\" not found on {}", stringify!($struct_name)))),
                }
            }

            fn visit<V: Visit>(&self, v: &mut V, key_prefix: &str, _description: &'static str) {
                $(
                    let key = if key_prefix.is_empty() {
                        stringify!($field_name).to_string()
                    } else {
                        format!("{key_prefix}.{}", stringify!($field_name))
                    };
                    self.$field_name.visit(v, &key, concat!($($d),*).trim());
                )*
            }
        }
    };
}

setfusion_settings! {
    /// setfusion settings (`SET setfusion.<name> = <value>`).
    pub struct SetfusionConfig {
        /// Replace DataFusion's set operations and semi/anti joins with setfusion operators.
        pub enabled: bool, default = true
        /// Set operations and semi / anti joins ask for both inputs hash-partitioned on their
        /// keys and decide each partition on its own (a Ballista cluster, where each task sees
        /// one partition: `setfusion_ballista` turns it on). false: one selection over
        /// all input partitions at once (one process, one device sees every row).
        pub hash_partition_inputs: bool, default = false
        /// Under `auto`, work smaller than this stays on the CPU: estimated rows of both inputs
        /// (set operations, semi / anti / mark and similarity joins), pairs (`families`) or a
        /// batch's list elements (list functions); see `exec::common::Unit`. 0: the GPU at any size.
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
        /// Parquet inputs of set operations and semi / anti joins whose keys alone are read
        /// (the build side; the probe side under a row count) are read by the device itself:
        /// column chunks uploaded, SNAPPY pages decompressed and pages decoded on the GPU.
        /// EXPLAIN names the reason wherever a Parquet input stays with DataFusion's scan.
        pub device_scan: bool, default = true
        /// The device column cache: key columns decoded by the device scan stay on the device
        /// between queries of this process (keyed by file path, size, modification time, byte
        /// ranges and column), least recently used first out, up to this many bytes (0 turns
        /// it off). It yields to any operator that needs the memory, and a changed file is
        /// read again.
        pub cache_limit: ByteSize, default = ByteSize(8 << 30)
        /// A similarity self join over Parquet files keeps its preprocessed sets in host memory
        /// between queries of this process (keyed by file path, size, modification time, footer,
        /// byte ranges, row selections and the scan), least recently used first out, up to this many
        /// bytes (0 turns it off): asked again, it reads only the columns its output and filter
        /// need. A changed file is read again.
        pub sets_cache_limit: ByteSize, default = ByteSize(2 << 30)
        /// Parquet inputs of a similarity join are read by ranges of rows, one partition each
        /// (each file listed once per range, with a row selection), where DataFusion would read
        /// a large row group on one thread. false: DataFusion's file groups (always so under
        /// `hash_partition_inputs`: a Ballista plan's codec does not carry row selections).
        pub scan_ranges: bool, default = true
        /// Take Parquet's min / max of float columns as bounds of all their values, as
        /// DataFusion does. They leave NaN out, so with NaNs in the data, pruning,
        /// constant columns and `min` / `max` from the statistics answer wrongly; false
        /// (the default) uses them only where no NaN could pass (`f = 2.5`, `f BETWEEN 1
        /// AND 2`). true: DataFusion's speed on data known to hold no NaN.
        pub trust_float_statistics: bool, default = false
    }
}

impl ConfigExtension for SetfusionConfig {
    const PREFIX: &'static str = "setfusion";
}

/// The devices of a process whose sessions name none (`setfusion executor --devices`).
static PROCESS_DEVICES: std::sync::OnceLock<Devices> = std::sync::OnceLock::new();

/// Make `devices` this process's GPUs for every session whose
/// `setfusion.devices` is `''` (a Ballista executor started with
/// `--devices 0,1`: the client's sessions carry the default, and the
/// executor knows its own GPUs). The first call wins.
pub fn set_process_devices(devices: Devices) {
    let _ = PROCESS_DEVICES.set(devices);
}

impl SetfusionConfig {
    /// The settings in force for a session (defaults if none were registered).
    pub fn from_options(options: &datafusion::config::ConfigOptions) -> Self {
        options.extensions.get::<SetfusionConfig>().cloned().unwrap_or_default()
    }

    /// The device of each key partition under `setfusion.devices`, with
    /// `count` the devices the driver sees ('all'); one entry means no split.
    pub fn device_ordinals(&self, count: impl FnOnce() -> usize) -> Vec<usize> {
        let devices = match (&self.devices, PROCESS_DEVICES.get()) {
            (Devices::One, Some(process)) => process,
            (session, _) => session,
        };
        match devices {
            Devices::One => vec![self.device],
            Devices::All => (0..count().max(1)).collect(),
            Devices::List(l) if l.is_empty() => vec![self.device],
            Devices::List(l) => l.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::config::ExtensionOptions;
    use datafusion::config::{ConfigOptions, Extensions};

    /// Every setting is listed under its full name, and a session built from
    /// those entries alone (what a Ballista scheduler does with a client's
    /// settings) ends up with the same values.
    #[test]
    fn entries_carry_the_prefix_and_set_back() {
        let mut c = SetfusionConfig::default();
        c.strategy = Strategy::Cpu;
        c.min_rows = 7;
        c.memory_limit = ByteSize(1 << 20);
        c.devices = "0,0".parse().unwrap();
        let entries = c.entries();
        assert!(entries.iter().all(|e| e.key.starts_with("setfusion.")), "{entries:?}");
        assert!(
            entries.iter().any(|e| e.key == "setfusion.strategy" && e.value.as_deref() == Some("cpu")),
            "{entries:?}"
        );
        let mut extensions = Extensions::new();
        extensions.insert(SetfusionConfig::default());
        let mut options = ConfigOptions::new().with_extensions(extensions);
        for e in &entries {
            options
                .set(&e.key, e.value.as_deref().unwrap_or_default())
                .unwrap_or_else(|err| panic!("{}: {err}", e.key));
        }
        let back = SetfusionConfig::from_options(&options);
        assert_eq!(
            (back.strategy, back.min_rows, back.memory_limit, back.devices.clone()),
            (c.strategy, c.min_rows, c.memory_limit, c.devices.clone())
        );
        assert!(options.entries().iter().any(|e| e.key == "setfusion.min_rows" && e.value.as_deref() == Some("7")));
    }
}
