//! Radix sort + Balanced Path multiset operators (seed 002): work in progress.
