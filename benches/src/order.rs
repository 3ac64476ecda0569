//! The order in which the contenders take their turns, balanced so that no contender always
//! runs right after the same other one.
//!
//! Rotating one fixed order (`(i + turn) % n`) keeps every contender's predecessor the same
//! in every turn, and what the machine carries over from the run before (the previous
//! proxy closing its connections, the scheduler's view of who was busy) then lands on each
//! contender differently, turn after turn: in the load bench `revoy-xds` always ran right after
//! `revoy`, and `revoy` right after `direct`. Here the turns follow a Williams design: over
//! `n` turns (`2n` for an odd `n`) every contender comes right after every other one equally
//! often, and holds every position equally often.

/// The contenders' indices (`0..n`) in the order they run at turn `turn`.
pub fn turn_order(n: usize, turn: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    // The first row: 0, 1, n-1, 2, n-2, ...; row r adds r to each (mod n).
    let first = (0..n).map(|i| {
        if i % 2 == 1 {
            i.div_ceil(2)
        } else {
            (n - i / 2) % n
        }
    });
    let rows = if n.is_multiple_of(2) { n } else { 2 * n };
    let row = turn % rows;
    let mut order: Vec<usize> = first.map(|c| (c + row) % n).collect();
    // An odd n needs the mirror rows too for every pair to meet in both orders.
    if row >= n {
        order.reverse();
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How often each contender ran right after each other over `turns` turns.
    fn follows(n: usize, turns: usize) -> Vec<Vec<usize>> {
        let mut count = vec![vec![0; n]; n];
        for t in 0..turns {
            let order = turn_order(n, t);
            for pair in order.windows(2) {
                count[pair[0]][pair[1]] += 1;
            }
        }
        count
    }

    #[test]
    fn every_turn_runs_every_contender_once() {
        for n in 1..9 {
            for t in 0..3 * n {
                let mut order = turn_order(n, t);
                order.sort_unstable();
                assert_eq!(order, (0..n).collect::<Vec<_>>(), "n={n} turn={t}");
            }
        }
    }

    #[test]
    fn each_contender_follows_every_other_equally_often() {
        for n in 2..9_usize {
            let rows = if n.is_multiple_of(2) { n } else { 2 * n };
            let expected = if n.is_multiple_of(2) { 1 } else { 2 };
            let count = follows(n, rows);
            for (a, row) in count.iter().enumerate() {
                for (b, &c) in row.iter().enumerate() {
                    let want = if a == b { 0 } else { expected };
                    assert_eq!(c, want, "n={n}: {b} after {a}");
                }
            }
        }
    }

    #[test]
    fn each_contender_holds_every_position_equally_often() {
        for n in 2..9_usize {
            let rows = if n.is_multiple_of(2) { n } else { 2 * n };
            let mut at = vec![vec![0; n]; n];
            for t in 0..rows {
                for (pos, c) in turn_order(n, t).into_iter().enumerate() {
                    at[c][pos] += 1;
                }
            }
            assert!(at.iter().flatten().all(|&k| k == rows / n), "n={n}: {at:?}");
        }
    }

    #[test]
    fn in_the_load_benchs_nine_turns_a_contender_follows_several_others() {
        // 6 contenders, 9 turns (the load bench's 3 rounds x 3 turns); a rotated fixed order
        // would give each one predecessor only.
        let count = follows(6, 9);
        let after_revoy = &count[0];
        assert!(after_revoy.iter().filter(|&&c| c > 0).count() >= 4);
    }
}
