//! The prefix changes and forwarded access log entries of a round: what this
//! instance writes from its outboxes, and what it reads from the others.

use super::*;

impl Task {
    /// Adds this round's writes to `pipe`: prefix batches, then forwarded
    /// entries by owner.
    pub(super) fn write(&self, pipe: &mut redis::Pipeline) -> Written {
        let max = self.cfg.max_batch_bytes;
        let mut w = Written {
            updates: 0,
            forwards: Vec::new(),
            bytes: 0,
        };
        let mut batches = 0;
        while w.updates < self.pending.len() && batches < WRITE_PER_ROUND {
            let mut size = 3;
            let mut end = w.updates;
            while end < self.pending.len() && end - w.updates < usize::from(u16::MAX) {
                let n = wire::update_len(&self.pending[end]);
                // A change larger than a batch still goes, alone.
                if size + n > max && end > w.updates {
                    break;
                }
                size += n;
                end += 1;
            }
            let slice: Vec<PeerUpdate> = self.pending.range(w.updates..end).cloned().collect();
            let bytes = wire::encode_updates(&slice);
            w.bytes += bytes.len() as u64;
            self.xadd(pipe, &self.prefix_key, &bytes);
            w.updates = end;
            batches += 1;
        }
        if batches > 0 {
            pipe.cmd("PEXPIRE")
                .arg(&self.prefix_key)
                .arg(STREAM_TTL_MS)
                .ignore();
        }
        let mut by_owner: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, f) in self.pending_fwd.iter().enumerate() {
            if by_owner.len() < OWNERS_PER_ROUND || by_owner.contains_key(f.owner.as_str()) {
                by_owner.entry(&f.owner).or_default().push(i);
            }
        }
        for (owner, idx) in by_owner {
            let key = log_key(&self.cfg.prefix, owner);
            let mut start = 0;
            while start < idx.len() {
                // Up to max_batch_bytes (an item larger than that goes alone).
                let (mut end, mut size) = (start, 3);
                while end < idx.len() && end - start < usize::from(u16::MAX) {
                    let n = 4 + self.pending_fwd[idx[end]].bytes.len();
                    if size + n > max && end > start {
                        break;
                    }
                    size += n;
                    end += 1;
                }
                let items: Vec<Vec<u8>> = idx[start..end]
                    .iter()
                    .map(|&i| self.pending_fwd[i].bytes.clone())
                    .collect();
                let bytes = wire::encode_items(&items);
                w.bytes += bytes.len() as u64;
                self.xadd(pipe, &key, &bytes);
                w.forwards.extend_from_slice(&idx[start..end]);
                start = end;
            }
            pipe.cmd("PEXPIRE").arg(&key).arg(STREAM_TTL_MS).ignore();
        }
        w
    }

    pub(super) fn xadd(&self, pipe: &mut redis::Pipeline, key: &str, bytes: &[u8]) {
        pipe.cmd("XADD")
            .arg(key)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.cfg.stream_max_len)
            .arg("*")
            .arg("i")
            .arg(&self.instance)
            .arg("b")
            .arg(bytes)
            .ignore();
    }

    /// Redis took this round's writes: they leave the pending queues.
    pub(super) fn sent(&mut self, w: Written) {
        let m = &self.shared.metrics;
        for _ in 0..w.updates {
            self.pending.pop_front();
        }
        m.peers.updates.add(PrefixUpdate::Sent, w.updates as u64);
        let mut keep = vec![true; self.pending_fwd.len()];
        for &i in &w.forwards {
            keep[i] = false;
        }
        let mut kept = keep.into_iter();
        self.pending_fwd.retain(|_| kept.next().unwrap_or(true));
        m.peers
            .forwards
            .add(Forwarded::Sent, w.forwards.len() as u64);
        m.peers.bytes.add(Direction::Sent, w.bytes);
    }

    pub(super) fn read(&mut self, read: StreamReadReply, topo: &Topology, redis_ms: u64) {
        for key in read.keys {
            let own = key.key == self.own_key;
            let load = key.key == self.load_key;
            for entry in key.ids {
                if own {
                    self.last_own.clone_from(&entry.id);
                } else if load {
                    self.last_load.clone_from(&entry.id);
                } else {
                    self.last_prefix.clone_from(&entry.id);
                }
                let from: Option<String> = entry.get("i");
                let Some(bytes) = entry.get::<Vec<u8>>("b") else {
                    continue;
                };
                if !own && from.as_deref() == Some(self.instance.as_str()) {
                    continue;
                }
                let m = &self.shared.metrics;
                m.peers.bytes.add(Direction::Received, bytes.len() as u64);
                if load {
                    let from = from.unwrap_or_default();
                    self.read_load(topo, &entry.id, &from, &bytes, redis_ms);
                } else if own {
                    match wire::decode_items(&bytes) {
                        Some(items) => {
                            for item in items {
                                if self.forwarded.try_send(item).is_err() {
                                    m.peers.forwards.add(Forwarded::Dropped, 1);
                                }
                            }
                        }
                        None => m.peers.forwards.add(Forwarded::Bad, 1),
                    }
                } else {
                    match wire::decode_updates(&bytes) {
                        Some(updates) => {
                            for u in updates {
                                self.shared.emit(Event::Peer(Box::new(u)));
                            }
                        }
                        None => m.peers.updates.inc(PrefixUpdate::Bad),
                    }
                }
            }
        }
    }
}
