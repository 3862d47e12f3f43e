//! `cargo bench --bench ssjoin -- [--out FILE] [--quick] [--reps N] [--no-nlj]
//! [--collections dblp,uniform,zipf] [--sets 100000,1000000] [--thresholds 0.5,0.6]
//! [--cpu-timeout-s S] [--no-cpu]`: see `setfusion::bench::ssjoin` (also
//! `setfusion bench ssjoin ...`).
fn main() {
    setfusion::bench::ssjoin::run(std::env::args().skip(1).collect());
}
