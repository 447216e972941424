//! The adaptive concurrency limit's rule (plain arithmetic over what API answers were seen):
//! additive increase while the limit is in use and the server answers promptly, multiplicative
//! decrease on a 429 or on latency rising past its baseline, within bounds. One decrease per
//! round (as many answers as the limit): one overload seen by many requests at once counts once.
//! Until the first decrease the limit doubles each round instead (TCP's slow start), so a
//! runtime that starts low reaches the server's capacity in a few rounds, not one slot a round.

use std::time::Duration;

use tokio::time::Instant;

/// The bounds and factors of the rule ([`crate::adaptive::AimdPolicy`] is the user's side).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rule {
    pub min: f64,
    pub max: f64,
    /// The factor a 429 multiplies the limit by.
    pub on_throttle: f64,
    /// The factor latency past `tolerance` × its baseline multiplies the limit by.
    pub on_latency: f64,
    pub tolerance: f64,
    /// How long the latency baseline (the fastest answer) is kept before it is measured again.
    pub baseline_window: Duration,
}

/// The limit and what it is computed from.
#[derive(Debug)]
pub(crate) struct Aimd {
    rule: Rule,
    limit: f64,
    /// The fastest answer of the last and the current baseline window.
    baseline: Option<Duration>,
    window_fastest: Option<Duration>,
    window_start: Instant,
    /// A moving average of recent answers' latency, in seconds.
    recent: Option<f64>,
    /// Answers left before another decrease may happen.
    cooldown: u64,
    /// No decrease yet: the limit doubles each round.
    slow_start: bool,
}

/// How much one answer weighs in the moving average.
const RECENT_WEIGHT: f64 = 0.1;

impl Aimd {
    pub(crate) fn new(rule: Rule, initial: f64) -> Self {
        Aimd {
            rule,
            limit: initial.clamp(rule.min, rule.max),
            baseline: None,
            window_fastest: None,
            window_start: Instant::now(),
            recent: None,
            cooldown: 0,
            slow_start: true,
        }
    }

    /// The limit now, in whole reconciles.
    pub(crate) fn limit(&self) -> usize {
        self.limit.floor() as usize
    }

    /// One answer: its latency, whether it was a 429, and whether every slot of the limit was
    /// in use when it came. The limit after it.
    pub(crate) fn answer(&mut self, latency: Duration, throttled: bool, saturated: bool) -> usize {
        let now = Instant::now();
        self.cooldown = self.cooldown.saturating_sub(1);
        if !throttled {
            self.learn(now, latency);
        }
        let slow = match (self.baseline, self.recent) {
            (Some(base), Some(recent)) => recent > base.as_secs_f64() * self.rule.tolerance,
            _ => false,
        };
        if (throttled || slow) && self.cooldown == 0 {
            let factor = if throttled {
                self.rule.on_throttle
            } else {
                self.rule.on_latency
            };
            self.limit = (self.limit * factor).max(self.rule.min);
            self.cooldown = self.limit.ceil() as u64;
            self.slow_start = false;
            // The queue that built up drains at the lower limit: measure latency afresh.
            self.recent = None;
        } else if !throttled && !slow && saturated {
            let step = if self.slow_start {
                1.0
            } else {
                1.0 / self.limit
            };
            self.limit = (self.limit + step).min(self.rule.max);
        }
        self.limit()
    }

    fn learn(&mut self, now: Instant, latency: Duration) {
        let s = latency.as_secs_f64();
        self.recent = Some(match self.recent {
            Some(r) => r + RECENT_WEIGHT * (s - r),
            None => s,
        });
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
            on_latency: 0.9,
            tolerance: 2.0,
            baseline_window: Duration::from_secs(5),
        }
    }

    const FAST: Duration = Duration::from_millis(2);

    #[tokio::test(start_paused = true)]
    async fn doubles_each_round_until_the_first_decrease() {
        let mut a = Aimd::new(rule(), 10.0);
        for _ in 0..10 {
            a.answer(FAST, false, false);
        }
        assert_eq!(a.limit(), 10, "not in use: no growth");
        for _ in 0..10 {
            a.answer(FAST, false, true);
        }
        assert_eq!(a.limit(), 20, "a round at 10: doubled");
        assert_eq!(a.answer(FAST, true, true), 10, "a 429 halves it");
        for _ in 0..10 {
            a.answer(FAST, false, true);
        }
        assert_eq!(a.limit(), 10, "then one a round: just short of 11");
    }

    #[tokio::test(start_paused = true)]
    async fn grows_by_one_a_round_while_in_use_and_not_when_idle() {
        let mut a = Aimd::new(rule(), 20.0);
        a.answer(FAST, true, true);
        assert_eq!(a.limit(), 10, "past slow start");
        for _ in 0..10 {
            a.answer(FAST, false, false);
        }
        assert_eq!(a.limit(), 10, "not in use: no growth");
        for _ in 0..10 {
            a.answer(FAST, false, true);
        }
        assert_eq!(a.limit(), 10, "about one per round: just short of 11");
        for _ in 0..12 {
            a.answer(FAST, false, true);
        }
        assert_eq!(a.limit(), 12);
        for _ in 0..100_000 {
            a.answer(FAST, false, true);
        }
        assert_eq!(a.limit(), 100, "bounded");
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_429s_halves_it_once_a_round() {
        let mut a = Aimd::new(rule(), 40.0);
        assert_eq!(a.answer(FAST, true, true), 20);
        for _ in 0..19 {
            assert_eq!(a.answer(FAST, true, true), 20, "the same overload");
        }
        assert_eq!(a.answer(FAST, true, true), 10, "a round later: again");
        for _ in 0..100 {
            a.answer(FAST, true, true);
        }
        assert_eq!(a.limit(), 2, "never below the minimum");
    }

    #[tokio::test(start_paused = true)]
    async fn latency_past_twice_its_baseline_lowers_it() {
        let mut a = Aimd::new(rule(), 40.0);
        for _ in 0..50 {
            a.answer(FAST, false, false);
        }
        let slow = FAST * 3;
        let mut limit = 40;
        for _ in 0..30 {
            limit = a.answer(slow, false, false);
        }
        assert!(limit < 40, "{limit}");
        // Latency within the tolerance does not.
        let mut b = Aimd::new(rule(), 40.0);
        for _ in 0..50 {
            b.answer(FAST, false, false);
        }
        for _ in 0..30 {
            b.answer(FAST.mul_f64(1.5), false, false);
        }
        assert_eq!(b.limit(), 40);
    }

    #[tokio::test(start_paused = true)]
    async fn the_baseline_follows_a_server_that_got_slower_for_good() {
        let mut a = Aimd::new(rule(), 20.0);
        for _ in 0..20 {
            a.answer(FAST, false, false);
        }
        // From now on every answer takes 10 ms, whatever the load.
        let slower = Duration::from_millis(10);
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(5)).await;
            for _ in 0..100 {
                a.answer(slower, false, true);
            }
        }
        let before = a.limit();
        for _ in 0..200 {
            a.answer(slower, false, true);
        }
        assert!(a.limit() > before, "grows again: {before} → {}", a.limit());
    }
}
