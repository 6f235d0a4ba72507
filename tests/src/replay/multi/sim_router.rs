//! What the simulator calls: a request routed by one of the instances, its
//! end logged on one of Envoy's streams, ticks and engine scrapes.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::*;

impl SimRouter for MultiRouter {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn route(&mut self, now: f64, id: usize, req: &TraceRequest, _: &View<'_>) -> usize {
        self.advance(now);
        let k = self.pick(req);
        let p = self.routers[k].fr.place(now, req);
        let (whole, prefill) = bounds(
            &self.lease_cfg,
            &LeaseInput {
                prefill_tokens: p.uncached + p.queued,
                max_tokens: Some(req.output_tokens.min(u64::from(u32::MAX)) as u32),
                prefill_ms_per_k: p.prefill_ms_per_k,
                ..Default::default()
            },
        );
        let replica = p.replica;
        self.push(
            now + prefill.as_secs_f64() * 1000.0,
            Action::PrefillBound(id),
        );
        self.push(now + whole.as_secs_f64() * 1000.0, Action::LeaseBound(id));
        self.leases[id] = Some(Lease {
            owner: k,
            placed: p,
            routed_at: now,
            held: true,
            finished_at: None,
            req: req.clone(),
        });
        self.by_replica[k][replica].push_back(id);
        self.pump(k, now);
        replica
    }

    fn finished(&mut self, now: f64, id: usize, cached: u64, ttft_ms: f64) {
        self.advance(now);
        if let Some(l) = self.leases[id].as_mut() {
            l.finished_at = Some(now);
        }
        let n = self.opts.routers as u64;
        let h = xxh3_64_with_seed(&(id as u64).to_le_bytes(), 17);
        // The entry rides one of Envoy's log streams, flushed on its beat.
        let at = ((h % LOG_STREAMS) % n) as usize;
        let flush = (h >> 32) as f64 / f64::from(u32::MAX) * self.opts.log_flush_ms;
        let log = Action::Log {
            id,
            at,
            cached,
            ttft: ttft_ms,
            finished: now,
        };
        self.push(now + flush, log);
    }

    fn tick(&mut self, now: f64) {
        self.advance(now);
        for r in &mut self.routers {
            SimRouter::tick(&mut r.fr, now);
        }
    }

    fn scrape(&mut self, now: f64, engines: &[EngineFigures]) {
        self.advance(now);
        let grace = 2.0 * self.scrape_ms + RECONCILE_SLACK_MS;
        for k in 0..self.routers.len() {
            let snap = self.routers[k].fr.shared().snapshot_full();
            for (r, e) in engines.iter().enumerate() {
                snap.topo.fleets[0].replicas[fleetroute::topology::ReplicaId(r)]
                    .load
                    .set_engine(e.running, e.waiting, Some(0.0));
                // Oldest first: the leases the engine no longer knows of.
                let queue = &mut self.by_replica[k][r];
                while queue
                    .front()
                    .is_some_and(|&id| !self.leases[id].as_ref().is_some_and(|l| l.held))
                {
                    queue.pop_front();
                }
                let old: Vec<usize> = queue
                    .iter()
                    .copied()
                    .filter(|&id| {
                        self.leases[id]
                            .as_ref()
                            .is_some_and(|l| l.held && now - l.routed_at > grace)
                    })
                    .collect();
                let surplus = old.len().saturating_sub((e.running + e.waiting) as usize);
                for id in old.into_iter().take(surplus) {
                    if self.end_lease(id, now) {
                        self.counts.reconciled += 1;
                    }
                }
            }
        }
    }
}
