//! The open connections: how many there are, which of them could be closed to make room for a
//! new one, and closing them.
//!
//! A connection that has not delivered a complete request (it is waiting for a request's head,
//! new or kept alive, or still sending a body) costs the server a socket and nothing else; one
//! whose request is being handled holds work under way. At the cap, a new connection closes the
//! longest-waiting of the first kind, as nginx reuses its idle and waiting connections when it
//! runs out: a flood of idle or slow sockets then only closes each other, and a client that
//! sends its request at once (a health check) is still served.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Where a connection is in its current request.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    /// Waiting for a request's head (a new connection, or one kept alive after a response).
    Waiting,
    /// The head has arrived; the body is still being read.
    Reading,
    /// The request is being handled or its response is being sent.
    Handling,
}

struct Slot {
    phase: Phase,
    /// Its place in the order of eviction while it has no request being handled.
    turn: Option<u64>,
    evict: Arc<Notify>,
}

#[derive(Default)]
struct Table {
    slots: HashMap<u64, Slot>,
    /// Connections that may be evicted, oldest turn first.
    evictable: BTreeMap<u64, u64>,
    next_id: u64,
    next_turn: u64,
}

impl Table {
    fn enqueue(&mut self, id: u64) {
        let turn = self.next_turn;
        self.next_turn += 1;
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.turn = Some(turn);
            self.evictable.insert(turn, id);
        }
    }

    fn dequeue(&mut self, id: u64) {
        if let Some(turn) = self.slots.get_mut(&id).and_then(|slot| slot.turn.take()) {
            self.evictable.remove(&turn);
        }
    }

    /// Closes the connection that has waited longest without a request being handled.
    fn evict_oldest(&mut self) -> bool {
        let Some((_, id)) = self.evictable.pop_first() else {
            return false;
        };
        if let Some(slot) = self.slots.remove(&id) {
            slot.evict.notify_one();
        }
        true
    }
}

/// Every open connection, and the cap on how many there may be.
pub(crate) struct Registry {
    table: Mutex<Table>,
    limit: usize,
}

impl Registry {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::default(),
            limit: limit.max(1),
        })
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // The table is consistent after every statement that changes it: a panic elsewhere
        // while it was locked leaves nothing half-done.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a new connection, evicting the oldest waiting one at the cap; `None` if
    /// every open connection has a request being handled.
    pub fn admit(self: &Arc<Self>) -> Option<Connection> {
        let mut table = self.table();
        if table.slots.len() >= self.limit && !table.evict_oldest() {
            return None;
        }
        let id = table.next_id;
        table.next_id += 1;
        let evict = Arc::new(Notify::new());
        let slot = Slot {
            phase: Phase::Waiting,
            turn: None,
            evict: evict.clone(),
        };
        table.slots.insert(id, slot);
        table.enqueue(id);
        Some(Connection {
            id,
            registry: self.clone(),
            evict,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.table().slots.len()
    }

    fn set_phase(&self, id: u64, phase: Phase) {
        let mut table = self.table();
        let Some(slot) = table.slots.get_mut(&id) else {
            return; // evicted
        };
        let was = std::mem::replace(&mut slot.phase, phase);
        match (was, phase) {
            (Phase::Handling, Phase::Waiting) => table.enqueue(id),
            (_, Phase::Handling) => table.dequeue(id),
            // A body being read keeps the turn its connection had while waiting for the head.
            _ => {}
        }
    }

    fn phase(&self, id: u64) -> Option<Phase> {
        self.table().slots.get(&id).map(|slot| slot.phase)
    }
}

/// One open connection's entry; removed when dropped.
pub(crate) struct Connection {
    id: u64,
    registry: Arc<Registry>,
    evict: Arc<Notify>,
}

impl Connection {
    /// A request's head has arrived: its body is being read.
    pub fn reading(&self) {
        self.registry.set_phase(self.id, Phase::Reading);
    }

    /// The request is complete and being handled: the connection is not evicted until the
    /// returned guard is dropped (when its response has been sent or abandoned).
    pub fn handling(&self) -> Handling {
        self.registry.set_phase(self.id, Phase::Handling);
        Handling {
            id: self.id,
            registry: self.registry.clone(),
        }
    }

    /// Whether it is waiting for a request's head (nothing of a request under way).
    pub fn is_waiting(&self) -> bool {
        self.registry.phase(self.id) == Some(Phase::Waiting)
    }

    /// Resolves when the connection is evicted to make room for another.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut table = self.registry.table();
        table.dequeue(self.id);
        table.slots.remove(&self.id);
    }
}

/// Held while a request is handled; its connection waits for the next request once dropped.
pub(crate) struct Handling {
    id: u64,
    registry: Arc<Registry>,
}

impl Drop for Handling {
    fn drop(&mut self) {
        self.registry.set_phase(self.id, Phase::Waiting);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_waiting_connection_is_evicted() {
        let registry = Registry::new(2);
        let first = registry.admit().unwrap();
        let second = registry.admit().unwrap();
        let busy = first.handling();
        // `first` is handling a request: `second` makes room.
        let third = registry.admit().unwrap();
        assert_eq!(registry.open(), 2);
        assert_eq!(registry.phase(second.id), None, "second was not evicted");
        drop(busy);
        // `first` waits again, after `third`: `third` is older in the queue.
        assert!(first.is_waiting());
        let _fourth = registry.admit().unwrap();
        assert_eq!(registry.phase(third.id), None, "third was not evicted");
        assert!(first.is_waiting());
    }

    #[test]
    fn with_every_connection_handling_a_request_a_new_one_is_refused() {
        let registry = Registry::new(1);
        let only = registry.admit().unwrap();
        let _busy = only.handling();
        assert!(registry.admit().is_none());
        drop(only);
        assert_eq!(registry.open(), 0);
        assert!(registry.admit().is_some());
    }
}
