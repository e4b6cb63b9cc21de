//! Property tests of the access-control rules: random changes, through the
//! lock table as the log applies them, against a plain model of what each
//! change should do. Checks that a refused change changes nothing, that
//! every permission answer matches the model (deny by default, prefixes,
//! roles through identities, denied identities), that token expiries are
//! kept and dropped with their tokens, that root can never be locked out,
//! and that the rules survive a snapshot (serialize and restore).

use deadbolt_core::{
    AclCommand, Command, FeatureLevel, Grant, LockError, LockTable, Permission, SecretHash,
    ROOT_IDENTITY, ROOT_ROLE,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const ROLES: [&str; 3] = [ROOT_ROLE, "jobs", "ops"];
const IDENTITIES: [&str; 3] = [ROOT_IDENTITY, "ci", "web"];
const TOKENS: [&str; 3] = ["t1", "t2", "t3"];
const RESOURCES: [&str; 5] = ["", "jobs/a", "jobs", "web/x", "jobs/b/c"];
const PREFIXES: [&str; 4] = ["", "jobs/", "web/", "jobs/b"];

fn grant() -> impl Strategy<Value = Grant> {
    (0..Permission::ALL.len(), 0..PREFIXES.len()).prop_map(|(p, prefix)| {
        let permission = Permission::ALL[p];
        // Admin takes no prefix; a prefixed one is refused (also tested).
        Grant::new(permission, PREFIXES[prefix])
    })
}

fn change() -> impl Strategy<Value = AclCommand> {
    let role = (0..ROLES.len()).prop_map(|i| ROLES[i].to_owned());
    let identity = (0..IDENTITIES.len()).prop_map(|i| IDENTITIES[i].to_owned());
    let token = (0..TOKENS.len()).prop_map(|i| TOKENS[i].to_owned());
    prop_oneof![
        token.clone().prop_map(|token_id| AclCommand::Bootstrap {
            token_id,
            hash: SecretHash([0; 32]),
        }),
        (role.clone(), prop::collection::vec(grant(), 0..4))
            .prop_map(|(name, grants)| AclCommand::PutRole { name, grants }),
        role.clone()
            .prop_map(|name| AclCommand::DeleteRole { name }),
        (identity.clone(), role.clone())
            .prop_map(|(identity, role)| AclCommand::GrantRole { identity, role }),
        (identity.clone(), role)
            .prop_map(|(identity, role)| AclCommand::RevokeRole { identity, role }),
        (token.clone(), identity.clone()).prop_map(|(token_id, identity)| {
            AclCommand::CreateToken {
                token_id,
                identity,
                hash: SecretHash([1; 32]),
            }
        }),
        (token.clone(), identity.clone(), 1..u64::MAX).prop_map(
            |(token_id, identity, expires_unix_ms)| AclCommand::CreateExpiringToken {
                token_id,
                identity,
                hash: SecretHash([2; 32]),
                expires_unix_ms,
            }
        ),
        token.prop_map(|token_id| AclCommand::RevokeToken { token_id }),
        identity
            .clone()
            .prop_map(|identity| AclCommand::DenyIdentity { identity }),
        identity.prop_map(|identity| AclCommand::AllowIdentity { identity }),
    ]
}

/// What the rules should be, written the obvious way.
#[derive(Debug, Clone, Default, PartialEq)]
struct Model {
    enabled: bool,
    roles: BTreeMap<String, BTreeSet<Grant>>,
    identities: BTreeMap<String, BTreeSet<String>>,
    tokens: BTreeMap<String, String>,
    expiries: BTreeMap<String, u64>,
    denied: BTreeSet<String>,
}

impl Model {
    /// Whether the change should be accepted, and the model after it.
    fn apply(&self, change: &AclCommand) -> Option<Model> {
        let mut next = self.clone();
        match change {
            AclCommand::Bootstrap { token_id, .. } => {
                if self.enabled {
                    return None;
                }
                next.enabled = true;
                next.roles.insert(
                    ROOT_ROLE.into(),
                    Permission::ALL.iter().map(|p| Grant::new(*p, "")).collect(),
                );
                next.identities
                    .insert(ROOT_IDENTITY.into(), BTreeSet::from([ROOT_ROLE.into()]));
                next.tokens.insert(token_id.clone(), ROOT_IDENTITY.into());
            }
            _ if !self.enabled => return None,
            AclCommand::PutRole { name, grants } => {
                let admin_prefixed = grants
                    .iter()
                    .any(|g| g.permission == Permission::Admin && !g.prefix.is_empty());
                if name == ROOT_ROLE || admin_prefixed {
                    return None;
                }
                next.roles
                    .insert(name.clone(), grants.iter().cloned().collect());
            }
            AclCommand::DeleteRole { name } => {
                if name == ROOT_ROLE || next.roles.remove(name).is_none() {
                    return None;
                }
                for roles in next.identities.values_mut() {
                    roles.remove(name);
                }
            }
            AclCommand::GrantRole { identity, role } => {
                if !self.roles.contains_key(role) {
                    return None;
                }
                next.identities
                    .entry(identity.clone())
                    .or_default()
                    .insert(role.clone());
            }
            AclCommand::RevokeRole { identity, role } => {
                if (identity == ROOT_IDENTITY && role == ROOT_ROLE)
                    || !self.roles.contains_key(role)
                {
                    return None;
                }
                if let Some(roles) = next.identities.get_mut(identity) {
                    roles.remove(role);
                }
            }
            AclCommand::CreateToken {
                token_id, identity, ..
            } => {
                if self.tokens.contains_key(token_id) {
                    return None;
                }
                next.tokens.insert(token_id.clone(), identity.clone());
            }
            AclCommand::CreateExpiringToken {
                token_id,
                identity,
                expires_unix_ms,
                ..
            } => {
                if self.tokens.contains_key(token_id) {
                    return None;
                }
                next.tokens.insert(token_id.clone(), identity.clone());
                next.expiries.insert(token_id.clone(), *expires_unix_ms);
            }
            AclCommand::RevokeToken { token_id } => {
                next.tokens.remove(token_id)?;
                next.expiries.remove(token_id);
            }
            AclCommand::DenyIdentity { identity } => {
                if identity == ROOT_IDENTITY {
                    return None;
                }
                next.denied.insert(identity.clone());
            }
            AclCommand::AllowIdentity { identity } => {
                if !next.denied.remove(identity) {
                    return None;
                }
            }
        }
        Some(next)
    }

    fn allows(&self, identity: Option<&str>, permission: Permission, resource: &str) -> bool {
        if !self.enabled {
            return true;
        }
        if identity.is_some_and(|i| self.denied.contains(i)) {
            return false;
        }
        let Some(roles) = identity.and_then(|i| self.identities.get(i)) else {
            return false;
        };
        roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flatten()
            .any(|g| g.permission == permission && resource.starts_with(g.prefix.as_str()))
    }
}

proptest! {
    #[test]
    fn the_rules_follow_the_model_and_a_refused_change_changes_nothing(
        changes in prop::collection::vec(change(), 0..40)
    ) {
        let mut table = LockTable::new();
        let newest = Command::SetClusterVersion { level: FeatureLevel::NEWEST };
        prop_assert!(table.apply(&newest).outcome.is_ok());
        let mut model = Model::default();
        for change in &changes {
            let before = table.acl().clone();
            let applied = table.apply(&Command::Acl(change.clone()));
            match model.apply(change) {
                Some(next) => {
                    prop_assert!(applied.outcome.is_ok(), "{change:?} refused: {:?}", applied.outcome);
                    model = next;
                }
                None => {
                    prop_assert!(
                        matches!(applied.outcome, Err(LockError::Acl(_))),
                        "{change:?} accepted: {:?}", applied.outcome
                    );
                    prop_assert_eq!(table.acl(), &before);
                }
            }
            prop_assert!(applied.events.is_empty());
            let acl = table.acl();
            prop_assert_eq!(acl.enabled(), model.enabled);
            for identity in IDENTITIES.iter().map(|i| Some(*i)).chain([None]) {
                for permission in Permission::ALL {
                    for resource in RESOURCES {
                        prop_assert_eq!(
                            acl.allows(identity, permission, resource),
                            model.allows(identity, permission, resource),
                            "{:?} {} {:?}", identity, permission, resource
                        );
                    }
                }
            }
            for token in TOKENS {
                prop_assert_eq!(
                    acl.token(token).map(|t| t.identity.as_str()),
                    model.tokens.get(token).map(String::as_str)
                );
                prop_assert_eq!(acl.token_expiry(token), model.expiries.get(token).copied());
            }
            for identity in IDENTITIES {
                prop_assert_eq!(acl.denied(identity), model.denied.contains(identity));
            }
            if model.enabled {
                prop_assert!(acl.allows(Some(ROOT_IDENTITY), Permission::Admin, ""));
            }
        }
        // A snapshot carries the rules whole: the table's own encoding, and
        // the ends the table image writes after it (tested in the server's
        // table_image.rs).
        let restored: LockTable =
            serde_json::from_str(&serde_json::to_string(&table).unwrap()).unwrap();
        let restored = restored
            .with_cluster_version(table.cluster_version())
            .with_credential_ends(table.acl().ends().clone());
        prop_assert_eq!(restored.acl(), table.acl());
    }
}
