//! `cargo bench --bench ssjoin -- [--out FILE] [--quick] [--reps N] [--no-nlj]`:
//! see `setfusion::bench::ssjoin` (also `setfusion bench ssjoin ...`).
fn main() {
    setfusion::bench::ssjoin::run(std::env::args().skip(1).collect());
}
