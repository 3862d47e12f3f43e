//! Multiset operations and sorted-list intersection (issue 15; seed 002
//! moderngpu "Multisets", seed 003 GTWJ and SvS).
//!
//! Every function takes lists sorted ascending (duplicates allowed) and
//! returns a list sorted ascending. Semantics are those of `std::set_*` /
//! moderngpu: a value with m copies in `a` and n copies in `b` appears
//!
//! | op | copies |
//! | --- | --- |
//! | [`MultisetOp::IntersectAll`] | min(m, n) |
//! | [`MultisetOp::ExceptAll`] | max(m − n, 0) |
//! | [`MultisetOp::UnionAll`] | max(m, n) |
//! | [`MultisetOp::SymmetricDifference`] | \|m − n\| |
//!
//! [`sorted_intersect`] is the min(m, n) rule too (so it equals
//! `multiset_op(IntersectAll, ..)`), chosen over a distinct result so that
//! chaining it ([`intersect_k`]) stays associative and agrees with
//! `set_intersect_all` and INTERSECT ALL.
//!
//! The functions are generic over `T: Ord + Clone`: the SQL functions use
//! i64 / u64 for integers and `String` for strings (compared as strings, i.e.
//! by UTF-8 bytes), so results are sorted in the element type's own order.

use std::cmp::Ordering;

/// A multiset operation on two sorted lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MultisetOp {
    IntersectAll,
    ExceptAll,
    UnionAll,
    SymmetricDifference,
}

impl MultisetOp {
    pub const ALL: [MultisetOp; 4] =
        [MultisetOp::IntersectAll, MultisetOp::ExceptAll, MultisetOp::UnionAll, MultisetOp::SymmetricDifference];

    /// The SQL function computing this operation.
    pub fn sql_name(self) -> &'static str {
        match self {
            MultisetOp::IntersectAll => "set_intersect_all",
            MultisetOp::ExceptAll => "set_except_all",
            MultisetOp::UnionAll => "set_union_all",
            MultisetOp::SymmetricDifference => "set_symmetric_difference",
        }
    }

    /// Whether an element of `a` without a key-rank partner in `b` is kept.
    fn keeps_a_only(self) -> bool {
        !matches!(self, MultisetOp::IntersectAll)
    }

    /// Whether an element of `b` without a key-rank partner in `a` is kept.
    fn keeps_b_only(self) -> bool {
        matches!(self, MultisetOp::UnionAll | MultisetOp::SymmetricDifference)
    }

    /// Whether a matched pair (the r-th copy of x in both lists) gives one output.
    fn keeps_pair(self) -> bool {
        matches!(self, MultisetOp::IntersectAll | MultisetOp::UnionAll)
    }

    /// The number of copies kept of a value with `m` copies in `a` and `n` in `b`.
    pub fn copies(self, m: usize, n: usize) -> usize {
        match self {
            MultisetOp::IntersectAll => m.min(n),
            MultisetOp::ExceptAll => m.saturating_sub(n),
            MultisetOp::UnionAll => m.max(n),
            MultisetOp::SymmetricDifference => m.abs_diff(n),
        }
    }
}

/// `op` on two ascending lists, as one merge.
///
/// The merge pairs the r-th copy of a value in `a` with the r-th copy in `b`
/// (moderngpu's key-rank match): min(m, n) pairs, then |m − n| copies left on
/// the longer side that meet a larger value (or the end) of the other list.
/// Each op keeps pairs and/or unpaired copies, which yields exactly the
/// counts in the module table.
pub fn multiset_op<T: Ord + Clone>(op: MultisetOp, a: &[T], b: &[T]) -> Vec<T> {
    let mut out = Vec::with_capacity(match op {
        MultisetOp::IntersectAll => a.len().min(b.len()),
        MultisetOp::ExceptAll => a.len(),
        MultisetOp::UnionAll | MultisetOp::SymmetricDifference => a.len() + b.len(),
    });
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => {
                if op.keeps_a_only() {
                    out.push(a[i].clone());
                }
                i += 1;
            }
            Ordering::Greater => {
                if op.keeps_b_only() {
                    out.push(b[j].clone());
                }
                j += 1;
            }
            Ordering::Equal => {
                if op.keeps_pair() {
                    out.push(a[i].clone());
                }
                i += 1;
                j += 1;
            }
        }
    }
    if op.keeps_a_only() {
        out.extend_from_slice(&a[i..]);
    }
    if op.keeps_b_only() {
        out.extend_from_slice(&b[j..]);
    }
    out
}

/// How [`sorted_intersect_with`] walks the two lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntersectMethod {
    /// Galloping when one list is [`GALLOP_RATIO`] times longer, else a merge.
    Auto,
    /// Two-pointer merge: O(|a| + |b|).
    Merge,
    /// Exponential search in the longer list for each run of the shorter:
    /// O(|small| log(|large| / |small|)).
    Gallop,
}

/// Size ratio from which galloping beats the linear merge: a galloping step
/// costs about 2 log2(gap) comparisons against the merge's gap, so it wins
/// once the average gap is well above ~8 (the usual threshold in SvS codes).
pub const GALLOP_RATIO: usize = 16;

/// Intersection of two ascending lists (duplicates allowed; a value with m
/// and n copies appears min(m, n) times). Inputs are NOT sorted here: an
/// unsorted input gives an unspecified (but panic-free) result; the SQL
/// function checks the order first.
pub fn sorted_intersect<T: Ord + Clone>(a: &[T], b: &[T]) -> Vec<T> {
    sorted_intersect_with(IntersectMethod::Auto, a, b)
}

/// [`sorted_intersect`] with a chosen method (all give the same result).
pub fn sorted_intersect_with<T: Ord + Clone>(method: IntersectMethod, a: &[T], b: &[T]) -> Vec<T> {
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let gallop = match method {
        IntersectMethod::Auto => small.len().saturating_mul(GALLOP_RATIO) < large.len(),
        IntersectMethod::Merge => false,
        IntersectMethod::Gallop => true,
    };
    let mut out = Vec::new();
    if gallop {
        gallop_intersect_into(small, large, &mut out);
    } else {
        merge_intersect_into(a, b, &mut out);
    }
    out
}

/// Two-pointer merge intersection (min(m, n) rule), appended to `out`.
fn merge_intersect_into<T: Ord + Clone>(a: &[T], b: &[T], out: &mut Vec<T>) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                out.push(a[i].clone());
                i += 1;
                j += 1;
            }
        }
    }
}

/// The first index in `v[from..]` whose element is not `pred`-true, found by
/// exponential then binary search (`pred` must be true on a prefix of `v`).
/// Costs O(log d) for an answer d places after `from`.
fn gallop<T>(v: &[T], from: usize, pred: impl Fn(&T) -> bool) -> usize {
    let mut lo = from;
    let mut step = 1;
    // Invariant: pred holds on v[from..lo].
    while lo + step <= v.len() && pred(&v[lo + step - 1]) {
        lo += step;
        step *= 2;
    }
    let hi = (lo + step).min(v.len());
    lo + v[lo..hi].partition_point(pred)
}

/// Galloping intersection: for each run of equal values in `small`, gallop in
/// `large` to the run's lower and upper bound (the run in `large` starts at or
/// after the previous one, so searches start from the cursor).
fn gallop_intersect_into<T: Ord + Clone>(small: &[T], large: &[T], out: &mut Vec<T>) {
    let (mut i, mut j) = (0, 0);
    while i < small.len() && j < large.len() {
        let x = &small[i];
        let run_end = i + small[i..].partition_point(|y| y == x);
        j = gallop(large, j, |y| y < x);
        let other_end = gallop(large, j, |y| y == x);
        let copies = (run_end - i).min(other_end - j);
        out.extend(std::iter::repeat_n(x, copies).cloned());
        i = run_end;
        j = other_end;
    }
}

/// Integer keys that can be grouped into GTWJ sequences (seed 003).
pub trait SequenceKey: Ord + Copy {
    /// floor(self / val): monotone in `self`, so a sorted list's sequence ids
    /// are non-decreasing and every sequence is one contiguous run.
    fn sequence_id(self, val: u64) -> i128;
}

impl SequenceKey for i64 {
    fn sequence_id(self, val: u64) -> i128 {
        (self as i128).div_euclid(val as i128)
    }
}

impl SequenceKey for u64 {
    fn sequence_id(self, val: u64) -> i128 {
        (self / val) as i128
    }
}

impl SequenceKey for u32 {
    fn sequence_id(self, val: u64) -> i128 {
        (self as u64 / val) as i128
    }
}

/// GTWJ sequence index of an ascending list: (sequence id, start, end) of each
/// non-empty sequence [id·val, (id+1)·val), in order.
pub fn sequence_index<T: SequenceKey>(v: &[T], val: u64) -> Vec<(i128, usize, usize)> {
    let val = val.max(1);
    let mut index: Vec<(i128, usize, usize)> = Vec::new();
    for (k, x) in v.iter().enumerate() {
        let id = x.sequence_id(val);
        match index.last_mut() {
            Some(last) if last.0 == id => last.2 = k + 1,
            _ => index.push((id, k, k + 1)),
        }
    }
    index
}

/// [`sorted_intersect`] by GTWJ sequence skipping (seed 003): both lists are
/// cut into sequences of width `val` (SeqID = x / val); only sequences with the
/// same id in both lists are merged, the others are skipped by comparing ids
/// alone. All copies of a value lie in one sequence, so the min(m, n) rule per
/// sequence is the rule for the lists. `val` 0 is treated as 1.
pub fn sorted_intersect_sequences<T: SequenceKey>(a: &[T], b: &[T], val: u64) -> Vec<T> {
    let (sa, sb) = (sequence_index(a, val), sequence_index(b, val));
    let mut out = Vec::new();
    let (mut p, mut q) = (0, 0);
    while p < sa.len() && q < sb.len() {
        match sa[p].0.cmp(&sb[q].0) {
            Ordering::Less => p += 1,
            Ordering::Greater => q += 1,
            Ordering::Equal => {
                merge_intersect_into(&a[sa[p].1..sa[p].2], &b[sb[q].1..sb[q].2], &mut out);
                p += 1;
                q += 1;
            }
        }
    }
    out
}

/// Intersection of k ascending lists by SvS (seed 003): the shortest list is
/// the candidate set, intersected with each next-longer list in turn
/// ([`sorted_intersect`], which gallops when the sizes differ a lot); stops
/// as soon as the candidates run out. No lists give an empty result.
pub fn intersect_k<T: Ord + Clone, L: AsRef<[T]>>(lists: &[L]) -> Vec<T> {
    let mut order: Vec<&[T]> = lists.iter().map(|l| l.as_ref()).collect();
    order.sort_by_key(|l| l.len());
    let Some((first, rest)) = order.split_first() else { return Vec::new() };
    let mut candidates = first.to_vec();
    for l in rest {
        if candidates.is_empty() {
            break;
        }
        candidates = sorted_intersect(&candidates, l);
    }
    candidates
}

/// The first position where `v` is not ascending: Some(i) with v[i] > v[i + 1].
pub fn first_descent<T: Ord>(v: &[T]) -> Option<usize> {
    v.windows(2).position(|w| w[0] > w[1])
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::{Rng, SeedableRng};

    use super::*;

    /// Counting reference: the module table applied to BTreeMap counts.
    fn reference(op: MultisetOp, a: &[i64], b: &[i64]) -> Vec<i64> {
        let mut counts: BTreeMap<i64, (usize, usize)> = BTreeMap::new();
        for x in a {
            counts.entry(*x).or_default().0 += 1;
        }
        for x in b {
            counts.entry(*x).or_default().1 += 1;
        }
        counts.into_iter().flat_map(|(x, (m, n))| std::iter::repeat_n(x, op.copies(m, n))).collect()
    }

    fn random_sorted(rng: &mut rand::rngs::StdRng, len: usize, domain: i64) -> Vec<i64> {
        let mut v: Vec<i64> = (0..len).map(|_| rng.random_range(-domain..domain)).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn moderngpu_worked_example() {
        let a = [1, 1, 2, 3, 3, 3, 5, 6, 6, 6, 6, 7, 7, 8, 8, 9];
        let b = [1, 2, 2, 3, 3, 3, 3, 6, 6, 6, 6, 8];
        // By hand from the counts (value: m in a, n in b): 1:2,1 2:1,2 3:3,4
        // 5:1,0 6:4,4 7:2,0 8:2,1 9:1,0.
        let expected: [(MultisetOp, &[i64]); 4] = [
            (MultisetOp::IntersectAll, &[1, 2, 3, 3, 3, 6, 6, 6, 6, 8]),
            // 3 has m − n = 3 − 4 < 0 copies: no 3 (moderngpu's "1 5 7 7 8 9").
            (MultisetOp::ExceptAll, &[1, 5, 7, 7, 8, 9]),
            (MultisetOp::UnionAll, &[1, 1, 2, 2, 3, 3, 3, 3, 5, 6, 6, 6, 6, 7, 7, 8, 8, 9]),
            (MultisetOp::SymmetricDifference, &[1, 2, 3, 5, 7, 7, 8, 9]),
        ];
        for (op, want) in expected {
            assert_eq!(multiset_op(op, &a, &b), want, "{op:?}");
            assert_eq!(reference(op, &a, &b), want, "{op:?} reference");
        }
        assert_eq!(sorted_intersect(&a, &b), expected[0].1);
        assert_eq!(sorted_intersect_sequences(&a, &b, 2), expected[0].1);
    }

    #[test]
    fn ops_match_counting_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        for case in 0..2000 {
            // Small domains give many duplicates; some lists are empty.
            let domain = [1, 2, 5, 20, 1000][case % 5];
            let (na, nb) = (rng.random_range(0..40), rng.random_range(0..40));
            let (a, b) = (random_sorted(&mut rng, na, domain), random_sorted(&mut rng, nb, domain));
            for op in MultisetOp::ALL {
                assert_eq!(multiset_op(op, &a, &b), reference(op, &a, &b), "{op:?} {a:?} {b:?}");
            }
        }
        assert!(multiset_op::<i64>(MultisetOp::UnionAll, &[], &[]).is_empty());
        assert_eq!(multiset_op(MultisetOp::ExceptAll, &[1, 1], &[]), vec![1, 1]);
        assert_eq!(multiset_op(MultisetOp::SymmetricDifference, &[], &[2, 2]), vec![2, 2]);
    }

    #[test]
    fn sorted_intersect_methods_agree() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for case in 0..2000 {
            let domain = [1, 3, 30, 1000, 100_000][case % 5];
            // Very different sizes exercise galloping under Auto.
            let na = rng.random_range(0..20);
            let nb = if case % 2 == 0 { rng.random_range(0..20) } else { rng.random_range(0..2000) };
            let (a, b) = (random_sorted(&mut rng, na, domain), random_sorted(&mut rng, nb, domain));
            let want = reference(MultisetOp::IntersectAll, &a, &b);
            for method in [IntersectMethod::Auto, IntersectMethod::Merge, IntersectMethod::Gallop] {
                assert_eq!(sorted_intersect_with(method, &a, &b), want, "{method:?} {a:?} {b:?}");
                assert_eq!(sorted_intersect_with(method, &b, &a), want, "{method:?} swapped");
            }
            for val in [1, 2, 7, 100, 5000] {
                assert_eq!(sorted_intersect_sequences(&a, &b, val), want, "GTWJ val {val}");
            }
            let ua: Vec<u64> = a.iter().map(|x| (x + domain) as u64).collect();
            let ub: Vec<u64> = b.iter().map(|x| (x + domain) as u64).collect();
            let uwant: Vec<u64> = want.iter().map(|x| (x + domain) as u64).collect();
            assert_eq!(sorted_intersect_sequences(&ua, &ub, 3), uwant);
        }
        assert_eq!(sorted_intersect_sequences(&[1i64, 2], &[2], 0), vec![2], "val 0 acts as 1");
    }

    #[test]
    fn sequence_index_handles_negatives() {
        // floor division: -1 and -100 are in sequence -1, 0..99 in 0.
        assert_eq!(sequence_index(&[-100i64, -1, 0, 99, 100], 100), vec![(-1, 0, 2), (0, 2, 4), (1, 4, 5)]);
    }

    #[test]
    fn intersect_k_matches_pairwise() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for case in 0..500 {
            let k = rng.random_range(0..6);
            let domain = [2, 10, 100][case % 3];
            let lists: Vec<Vec<i64>> = (0..k)
                .map(|_| {
                    let n = rng.random_range(0..60);
                    random_sorted(&mut rng, n, domain)
                })
                .collect();
            let want = match lists.split_first() {
                None => vec![],
                Some((first, rest)) => {
                    rest.iter().fold(first.clone(), |acc, l| reference(MultisetOp::IntersectAll, &acc, l))
                }
            };
            assert_eq!(intersect_k(&lists), want, "{lists:?}");
        }
        let strings = [vec!["a".to_string(), "b".into(), "b".into()], vec!["b".into(), "b".into(), "c".into()]];
        assert_eq!(intersect_k(&strings), vec!["b".to_string(), "b".into()]);
    }

    #[test]
    fn first_descent_finds_unsorted() {
        assert_eq!(first_descent(&[1, 2, 2, 3]), None);
        assert_eq!(first_descent(&[1, 3, 2]), Some(1));
        assert_eq!(first_descent::<i64>(&[]), None);
    }
}
