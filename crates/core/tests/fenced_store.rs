//! Property test of the fenced store against a model: a change is accepted
//! exactly when its token was issued, is not below the key's fence, and (in
//! strict mode) is the named lock's current grant; accepted changes raise the
//! fence to the token; refused ones change nothing at all.

use deadbolt_core::{
    AcquireOutcome, Command, LockError, LockTable, Outcome, SecretHash, SessionId, StoredValue,
    Token,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

const KEYS: [&str; 3] = ["x", "y", "z"];

#[derive(Debug, Clone)]
enum Step {
    /// A new grant (release, then acquire again): mints the next token.
    Regrant,
    /// A store change with the token picked `age` grants back (0: newest);
    /// `strict` names the lock.
    Put(usize, usize, bool),
    Read(usize, usize, bool),
    Delete(usize, usize, bool),
    /// A token no grant has carried yet.
    Forged(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => Just(Step::Regrant),
        4 => (0..3usize, 0..4usize, any::<bool>()).prop_map(|(k, a, s)| Step::Put(k, a, s)),
        2 => (0..3usize, 0..4usize, any::<bool>()).prop_map(|(k, a, s)| Step::Read(k, a, s)),
        1 => (0..3usize, 0..4usize, any::<bool>()).prop_map(|(k, a, s)| Step::Delete(k, a, s)),
        1 => (0..3usize).prop_map(Step::Forged),
    ]
}

fn apply(table: &mut LockTable, command: Command) -> Result<Outcome, LockError> {
    table.apply(&command).outcome
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn the_store_admits_exactly_the_tokens_a_fence_allows(steps in prop::collection::vec(step(), 1..120)) {
        let mut table = LockTable::new();
        let Ok(Outcome::SessionOpened { session, .. }) =
            apply(&mut table, Command::OpenSession { ttl_ms: 10_000, secret: SecretHash([0; 32]), owner: None })
        else {
            panic!("open refused")
        };
        let grant = |table: &mut LockTable, session: SessionId| -> Token {
            match apply(table, Command::Acquire { session, lock: "job".into(), wait: false, attempt: 0 , lock_delay_ms: 0 }) {
                Ok(Outcome::Acquire(AcquireOutcome::Granted { token })) => token,
                other => panic!("acquire answered {other:?}"),
            }
        };
        let mut tokens = vec![grant(&mut table, session)];
        // The model: per key, the fence and the value.
        let mut model: BTreeMap<&str, (Token, Option<String>)> = BTreeMap::new();
        let mut writes = 0;
        for step in steps {
            let (key, token, strict, command) = match step {
                Step::Regrant => {
                    let current = *tokens.last().unwrap();
                    apply(&mut table, Command::Release { session, lock: "job".into(), token: current }).unwrap();
                    tokens.push(grant(&mut table, session));
                    continue;
                }
                Step::Put(k, age, strict) | Step::Read(k, age, strict) | Step::Delete(k, age, strict) => {
                    let token = tokens[tokens.len().saturating_sub(1 + age)];
                    let key = KEYS[k];
                    let lock = strict.then(|| "job".to_owned());
                    writes += 1;
                    let command = match step {
                        Step::Put(..) => Command::StorePut { key: key.into(), value: format!("v{writes}"), token, lock },
                        Step::Read(..) => Command::StoreRead { key: key.into(), token, lock },
                        _ => Command::StoreDelete { key: key.into(), token, lock },
                    };
                    (key, token, strict, command)
                }
                Step::Forged(k) => {
                    let token = Token(tokens.last().unwrap().0 + 1);
                    (KEYS[k], token, false, Command::StorePut { key: KEYS[k].into(), value: "forged".into(), token, lock: None })
                }
            };
            let newest = *tokens.last().unwrap();
            let fence = model.get(key).map(|(fence, _)| *fence);
            let allowed = token <= newest
                && fence.is_none_or(|fence| token >= fence)
                && (!strict || token == newest);
            let before = table.clone();
            let outcome = apply(&mut table, command.clone());
            table.check_invariants();
            prop_assert_eq!(outcome.is_ok(), allowed, "{:?} with fence {:?}: {:?}", command, fence, outcome);
            let Ok(outcome) = outcome else {
                prop_assert_eq!(&table, &before, "a refused change changed the table");
                continue;
            };
            let entry = model.entry(key).or_insert((token, None));
            entry.0 = token;
            match (command, outcome) {
                (Command::StorePut { value, .. }, Outcome::Stored { fence }) => {
                    prop_assert_eq!(fence, token);
                    entry.1 = Some(value);
                }
                (Command::StoreRead { .. }, Outcome::Read(read)) => {
                    prop_assert_eq!(read, StoredValue { value: entry.1.clone(), fence: token });
                }
                (Command::StoreDelete { .. }, Outcome::Deleted { existed }) => {
                    prop_assert_eq!(existed, entry.1.take().is_some());
                }
                (command, outcome) => prop_assert!(false, "{:?} answered {:?}", command, outcome),
            }
            prop_assert_eq!(
                table.store().get(key),
                Some(StoredValue { value: entry.1.clone(), fence: entry.0 })
            );
        }
    }
}

#[test]
fn a_stale_write_names_both_tokens() {
    let mut table = LockTable::new();
    let Ok(Outcome::SessionOpened { session, .. }) = apply(
        &mut table,
        Command::OpenSession {
            ttl_ms: 10_000,
            secret: SecretHash([0; 32]),
            owner: None,
        },
    ) else {
        panic!("open refused")
    };
    for _ in 0..2 {
        let acquire = Command::Acquire {
            session,
            lock: format!("l{}", table.lock_count()),
            wait: false,
            attempt: 0,
            lock_delay_ms: 0,
        };
        apply(&mut table, acquire).unwrap();
    }
    let put = |token| Command::StorePut {
        key: "report".into(),
        value: "done".into(),
        token: Token(token),
        lock: None,
    };
    apply(&mut table, put(2)).unwrap();
    let err = apply(&mut table, put(1)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "stale fencing token 1 for key \"report\": it has already accepted token 2"
    );
    for unissued in [0, 3] {
        let err = apply(&mut table, put(unissued)).unwrap_err();
        assert!(err.to_string().contains("has not been issued"), "{err}");
    }
}
