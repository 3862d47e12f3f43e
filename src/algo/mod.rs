//! Algorithms: each family has a CPU twin and a GPU implementation behind one signature.
pub mod families;
pub mod join_filter;
pub mod multiset;
pub mod radix_sort;
pub mod row_hash;
pub mod setops;
pub mod sort_setops;
pub mod sorted_intersect;
pub mod ssjoin;
pub mod ssjoin_prep;

use datafusion::error::Result;

use crate::gpu::Gpu;

/// A kernel family's self-check against its CPU twin (run by `setfusion doctor`).
pub type SelfCheck = fn(&Gpu) -> Result<String>;

/// Every family's self-check, by kernel family name.
pub fn self_checks() -> Vec<(&'static str, SelfCheck)> {
    vec![
        ("families", families::self_check as SelfCheck),
        ("multiset", multiset::self_check as SelfCheck),
        ("hash_setops + bitmap_setops", setops::self_check as SelfCheck),
        ("join_filter", join_filter::self_check as SelfCheck),
        ("radix_sort", radix_sort::self_check as SelfCheck),
        ("row_hash", row_hash::self_check as SelfCheck),
        ("sort_setops", sort_setops::self_check as SelfCheck),
        ("sorted_intersect", sorted_intersect::self_check as SelfCheck),
        ("ssjoin", ssjoin::self_check as SelfCheck),
        ("ssjoin_prep", ssjoin_prep::self_check as SelfCheck),
    ]
}
