//! The adaptive concurrency limit's rule (plain arithmetic over what API answers were seen):
//! additive increase while the limit is in use and the server is not queueing, multiplicative
//! decrease on a 429 or on a queue building up, within bounds.
//!
//! The rule decides once a round (as many answers as the limit), and after a decrease it waits
//! out the answers to the requests that were already in flight: one overload seen by many
//! requests at once counts once. The server's queue is estimated as TCP Vegas estimates a
//! path's: the requests in flight times `1 - baseline / latency`, where the baseline is the
//! fastest answer of the last windows (the server with nothing queued) and the latency is the
//! round's mean (a queue that fills and drains delays most answers of a round but not all, so
//! the round's fastest answer would miss it; a busy CPU on the client's side raises the mean
//! too, and more requests at once would not help such a client either). A queue past
//! `queue_tolerance × log10(limit)` requests lowers the limit; below half that, a round whose
//! slots were in use raises it. Until the first decrease or the first queue, the limit grows
//! by half each round instead (TCP's slow start), so a runtime that starts low reaches the
//! server's capacity in a few rounds, not one slot a round.

use std::time::Duration;

use tokio::time::Instant;

/// The bounds and factors of the rule ([`crate::adaptive::AimdPolicy`] is the user's side).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rule {
    pub min: f64,
    pub max: f64,
    /// The factor a 429 multiplies the limit by.
    pub on_throttle: f64,
    /// The factor a queue past the tolerance multiplies the limit by.
    pub on_queue: f64,
    /// Requests queued at the server, per decade of the limit, that lower it.
    pub queue_tolerance: f64,
    /// How long the latency baseline (the fastest answer) is kept before it is measured again.
    pub baseline_window: Duration,
}

/// What one round's answers showed.
#[derive(Debug, Default)]
struct Round {
    answers: u64,
    throttled: bool,
    /// Answers that came while every slot was in use.
    saturated: u64,
    /// The sum of the latencies of the answers that were not 429s.
    latency_sum: Duration,
    /// The sum of the requests in flight at each answer.
    in_flight: u64,
}

/// The limit (a whole number of slots) and what it is computed from.
#[derive(Debug)]
pub(crate) struct Aimd {
    rule: Rule,
    limit: f64,
    /// The fastest answer of the last and the current baseline window.
    baseline: Option<Duration>,
    window_fastest: Option<Duration>,
    window_start: Instant,
    round: Round,
    /// Answers left, after a decrease, to requests sent before it: they tell of the limit
    /// before it and do not count.
    draining: u64,
    /// No decrease and no queue yet: the limit grows by half each round.
    slow_start: bool,
}

impl Aimd {
    pub(crate) fn new(rule: Rule, initial: f64) -> Self {
        Aimd {
            rule,
            limit: initial.floor().clamp(rule.min, rule.max),
            baseline: None,
            window_fastest: None,
            window_start: Instant::now(),
            round: Round::default(),
            draining: 0,
            slow_start: true,
        }
    }

    /// The limit now, in whole reconciles.
    pub(crate) fn limit(&self) -> usize {
        self.limit.floor() as usize
    }

    /// One answer: its latency, whether it was a 429, whether every slot of the limit was in
    /// use when it came, and how many requests were in flight (this one included). The limit
    /// after it.
    pub(crate) fn answer(
        &mut self,
        latency: Duration,
        throttled: bool,
        saturated: bool,
        in_flight: usize,
    ) -> usize {
        let now = Instant::now();
        if !throttled {
            self.learn(now, latency);
        }
        if self.draining > 0 {
            self.draining -= 1;
            return self.limit();
        }
        let r = &mut self.round;
        r.answers += 1;
        r.saturated += u64::from(saturated);
        r.in_flight += in_flight as u64;
        if throttled {
            r.throttled = true;
        } else {
            r.latency_sum += latency;
        }
        // A 429 ends the round at once: the server refuses work now.
        if (throttled || r.answers >= self.limit as u64) && self.decide() {
            // The other requests out were sent under the old limit.
            self.draining = in_flight.saturating_sub(1) as u64;
        }
        self.limit()
    }

    /// The end of a round: its answers move the limit. Whether it went down.
    fn decide(&mut self) -> bool {
        let round = std::mem::take(&mut self.round);
        let queue = match self.baseline {
            Some(base) if !round.latency_sum.is_zero() => {
                let in_flight = round.in_flight as f64 / round.answers as f64;
                let mean = round.latency_sum.as_secs_f64() / round.answers as f64;
                in_flight * (1.0 - base.as_secs_f64() / mean).max(0.0)
            }
            _ => 0.0,
        };
        let tolerated = self.rule.queue_tolerance * self.limit.max(10.0).log10();
        let r = &self.rule;
        if round.throttled || queue > tolerated {
            let factor = if round.throttled {
                r.on_throttle
            } else {
                r.on_queue
            };
            self.limit = (self.limit * factor).floor().max(r.min);
            self.slow_start = false;
            return true;
        }
        if queue > tolerated / 2.0 {
            // The server has begun to queue: the limit stays, and grows one a round from here.
            self.slow_start = false;
        } else if round.saturated * 2 > round.answers {
            let step = if self.slow_start {
                (self.limit / 2.0).floor()
            } else {
                1.0
            };
            self.limit = (self.limit + step.max(1.0)).min(r.max);
        }
        false
    }

    fn learn(&mut self, now: Instant, latency: Duration) {
        self.window_fastest = Some(self.window_fastest.map_or(latency, |f| f.min(latency)));
        self.baseline = Some(self.baseline.map_or(latency, |b| b.min(latency)));
        if now.saturating_duration_since(self.window_start) >= self.rule.baseline_window {
            // The baseline follows the server: the last window's fastest answer.
            self.baseline = self.window_fastest;
            self.window_fastest = None;
            self.window_start = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> Rule {
        Rule {
            min: 2.0,
            max: 100.0,
            on_throttle: 0.5,
            on_queue: 0.9,
            queue_tolerance: 6.0,
            baseline_window: Duration::from_secs(5),
        }
    }

    const FAST: Duration = Duration::from_millis(2);

    /// `n` answers of `latency` while every slot is in use, `in_flight` requests out.
    fn busy(a: &mut Aimd, n: usize, latency: Duration, in_flight: usize) -> usize {
        for _ in 0..n {
            a.answer(latency, false, true, in_flight);
        }
        a.limit()
    }

    #[tokio::test(start_paused = true)]
    async fn grows_by_half_a_round_until_the_first_decrease() {
        let mut a = Aimd::new(rule(), 10.0);
        for _ in 0..10 {
            a.answer(FAST, false, false, 3);
        }
        assert_eq!(a.limit(), 10, "not in use: no growth");
        assert_eq!(
            busy(&mut a, 10, FAST, 10),
            15,
            "a round at 10: half as much more"
        );
        assert_eq!(busy(&mut a, 15, FAST, 15), 22);
        assert_eq!(a.answer(FAST, true, true, 1), 11, "a 429 halves it at once");
        assert_eq!(busy(&mut a, 11, FAST, 11), 12, "then one a round");
        assert_eq!(busy(&mut a, 12, FAST, 12), 13);
    }

    #[tokio::test(start_paused = true)]
    async fn grows_by_one_a_round_while_in_use_and_not_when_idle() {
        let mut a = Aimd::new(rule(), 20.0);
        a.answer(FAST, true, true, 1);
        assert_eq!(a.limit(), 10, "past slow start");
        for _ in 0..30 {
            a.answer(FAST, false, false, 4);
        }
        assert_eq!(a.limit(), 10, "not in use: no growth");
        assert_eq!(busy(&mut a, 10, FAST, 10), 11);
        for _ in 0..100_000 {
            a.answer(FAST, false, true, 8);
        }
        assert_eq!(a.limit(), 100, "bounded");
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_429s_halves_it_once_for_the_requests_then_out() {
        let mut a = Aimd::new(rule(), 40.0);
        assert_eq!(a.answer(FAST, true, true, 40), 20);
        for _ in 0..39 {
            assert_eq!(
                a.answer(FAST, true, true, 40),
                20,
                "sent before the decrease"
            );
        }
        assert_eq!(a.answer(FAST, true, true, 20), 10, "sent after it: again");
        for _ in 0..1000 {
            a.answer(FAST, true, true, 20);
        }
        assert_eq!(a.limit(), 2, "never below the minimum");
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_at_the_server_stops_growth_and_then_lowers_the_limit() {
        // A server of 16 seats, each answer 2 ms alone: n in flight wait n/16 × 2 ms.
        let served = |n: usize| FAST.mul_f64((n as f64 / 16.0).max(1.0));
        let mut a = Aimd::new(rule(), 8.0);
        busy(&mut a, 8, served(8), 8);
        // Slow start: 8, 12, 18, 27; at 27 in flight 11 are queued (past 6 × log10 27 = 8.6).
        let mut seen = vec![a.limit()];
        for _ in 0..20 {
            let n = a.limit();
            seen.push(busy(&mut a, n, served(n), n));
        }
        assert_eq!(&seen[..4], &[12, 18, 27, 24], "{seen:?}");
        let settled = *seen.last().unwrap();
        assert!(
            (18..=24).contains(&settled),
            "it holds a few requests queued past the 16 seats: {seen:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_that_spares_one_answer_a_round_still_lowers_it() {
        // A server whose queue fills and drains: each round one request finds a free seat and
        // is answered at once, the others wait three times as long.
        let mut a = Aimd::new(rule(), 40.0);
        a.answer(FAST, true, true, 1);
        let start = a.limit();
        for round in 0..5 {
            for i in 0..a.limit() {
                let late = if i == round % 5 { FAST } else { FAST * 3 };
                a.answer(late, false, true, a.limit());
            }
        }
        assert!(a.limit() < start, "{start} → {}", a.limit());
    }

    #[tokio::test(start_paused = true)]
    async fn the_baseline_follows_a_server_that_got_slower_for_good() {
        let mut a = Aimd::new(rule(), 20.0);
        a.answer(FAST, true, true, 1);
        busy(&mut a, 10, FAST, 10);
        // From now on every answer takes 10 ms, whatever the load.
        let slower = Duration::from_millis(10);
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(5)).await;
            let n = a.limit();
            busy(&mut a, n, slower, n);
        }
        let before = a.limit();
        for _ in 0..5 {
            let n = a.limit();
            busy(&mut a, n, slower, n);
        }
        assert!(a.limit() > before, "grows again: {before} → {}", a.limit());
    }
}
