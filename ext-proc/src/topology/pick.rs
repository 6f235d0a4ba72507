//! Why a decision chose its replica, as `/debug/decisions` shows it.

/// The reason a replica was chosen over the sampling key's rendezvous home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The key's home among the ready replicas.
    Key,
    /// Another replica held more of the prompt.
    Prefix,
    /// The home was past its share of new conversations (or a replica that
    /// would have won on cost was).
    Share,
    /// The home was past the bounded-load guard.
    LoadGuard,
    /// The home's queue put it outside the tie.
    Load,
}

impl Pick {
    pub fn as_str(self) -> &'static str {
        match self {
            Pick::Key => "key",
            Pick::Prefix => "prefix",
            Pick::Share => "share",
            Pick::LoadGuard => "load_guard",
            Pick::Load => "load",
        }
    }
}

impl std::fmt::Display for Pick {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
