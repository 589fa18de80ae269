//! The kept state and inventory equal the whole build after any sequence of watch events:
//! random walks over a few hosts, Nodes and Secrets (hosts moved between Nodes and Secrets,
//! deleted and recreated; records whose ids two hosts' statuses share; relists), compared
//! after every step.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::runtime::watcher::Event;
use metalguard_api::k8s::GuardedHost;
use serde_json::{Value, json};

use super::*;
use crate::backend::StoredReport;
use crate::kube::changes::Consumer;
use crate::kube::world::{WorldWriters, apply};

const NS: &str = "mg";
const CREDENTIALS: &str = "mg-bmc";

/// xorshift64*: enough randomness for a walk, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[usize::try_from(self.below(items.len() as u64)).unwrap()]
    }
}

const HOSTS: [&str; 6] = ["h-0", "h-1", "h-2", "h-3", "h-4", "h-5"];
const NODES: [&str; 4] = ["n-0", "n-1", "n-2", "n-3"];
const SECRETS: [&str; 3] = ["bmc-0", "bmc-1", "bmc-2"];

fn time(rng: &mut Rng) -> String {
    format!("2026-11-29T10:{:02}:{:02}Z", rng.below(60), rng.below(60))
}

fn host(rng: &mut Rng, name: &str, version: u64) -> GuardedHost {
    let node = rng.pick(&NODES);
    let secret = rng.pick(&SECRETS);
    // Ids from small pools, so that two hosts' statuses share some.
    let remediation = rng.below(3);
    let mut annotations = serde_json::Map::new();
    if rng.below(2) == 0 {
        annotations.insert("pre-drain.hook.metalguard.io/etcd".into(), json!("guard"));
    }
    let status = if rng.below(4) == 0 {
        Value::Null
    } else {
        json!({
            "remediation": {"id": format!("remediation/x/{remediation}"), "phase": "PoweringOff",
                "attempt": 1, "executor": "h-0", "cause": "test", "startTime": time(rng),
                "phaseTransitionTime": time(rng), "seq": rng.below(5)},
            "operations": [{"id": format!("op-{}", rng.below(4)), "agent": rng.pick(&HOSTS),
                "type": "fence", "target": name, "power": "off", "createTime": time(rng)}],
            "holds": [{"id": format!("{name}/{}", rng.below(2)), "since": time(rng), "by": "ops",
                "action": "off", "reportedBy": name, "recordTime": time(rng)}],
        })
    };
    let mut spec = json!({"nodeName": node, "role": "Worker",
        "bmc": {"address": format!("ipmi://10.0.0.{}", rng.below(3)), "credentialsSecret": {"name": secret}}});
    if rng.below(5) == 0 {
        spec["retirement"] =
            json!({"requestedAt": time(rng), "requestedBy": "ops", "reason": "replace"});
    }
    if rng.below(6) == 0 {
        spec["bmcCheckRequest"] =
            json!({"id": format!("c{}", rng.below(9)), "requestedAt": time(rng)});
    }
    let mut object = json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": version.to_string(),
            "labels": {"pool": rng.pick(&["a", "b"])}, "annotations": annotations},
        "spec": spec});
    if !status.is_null() {
        object["status"] = status;
    }
    serde_json::from_value(object).unwrap()
}

fn node(rng: &mut Rng, name: &str, version: u64) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": version.to_string(),
            "labels": {"zone": rng.pick(&["z1", "z2"])}},
        "status": {"conditions": [{"type": "Ready", "status": rng.pick(&["True", "False", "Unknown"]),
            "lastTransitionTime": time(rng)}]}}))
    .unwrap()
}

fn secret(rng: &mut Rng, name: &str, version: u64) -> Secret {
    let mut data = serde_json::Map::new();
    data.insert("password".into(), json!("aHVudGVyMg=="));
    if rng.below(4) != 0 {
        data.insert(
            "username".into(),
            json!(rng.pick(&["YWRtaW4=", "cm9vdA=="])),
        );
    }
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": CREDENTIALS, "resourceVersion": version.to_string()},
        "data": data}))
    .unwrap()
}

/// One random watch event (or a relist of the Nodes).
fn step(rng: &mut Rng, world: &World, writers: &mut WorldWriters, version: u64) {
    match rng.below(9) {
        0..=2 => {
            let name = rng.pick(&HOSTS);
            let object = host(rng, name, version);
            apply(&mut writers.hosts, object);
        }
        3 => {
            let name = rng.pick(&HOSTS);
            if let Some(h) = world.host(name) {
                writers
                    .hosts
                    .apply_watcher_event(&Event::Delete((*h).clone()));
            }
        }
        4 | 5 => {
            let name = rng.pick(&NODES);
            let object = node(rng, name, version);
            apply(&mut writers.nodes, object);
        }
        6 => {
            let name = rng.pick(&NODES);
            if let Some(n) = world.nodes.get(&ObjectRef::new(name)) {
                writers
                    .nodes
                    .apply_watcher_event(&Event::Delete((*n).clone()));
            }
        }
        7 => {
            let name = rng.pick(&SECRETS);
            let object = secret(rng, name, version);
            apply(&mut writers.secrets, object);
        }
        _ => {
            // A relist that lost one Node (deleted while the watch was down).
            let lost = rng.pick(&NODES);
            let kept: Vec<Node> = world
                .nodes
                .state()
                .iter()
                .filter(|n| n.name_any() != lost)
                .map(|n| (**n).clone())
                .collect();
            writers.nodes.apply_watcher_event(&Event::Init);
            for n in kept {
                writers.nodes.apply_watcher_event(&Event::InitApply(n));
            }
            writers.nodes.apply_watcher_event(&Event::InitDone);
        }
    }
}

fn whole_state(world: &World) -> State {
    let (state, _) = world::state(world, &BTreeMap::<String, StoredReport>::new());
    state
}

fn kept_state(cache: &StateCache, world: &World) -> State {
    let mut state = cache.state();
    state.changes = None;
    world::finish_state(world, &BTreeMap::new(), &mut state);
    state
}

fn inventory_of(result: Result<Inventory, String>) -> Result<Vec<InventoryHost>, String> {
    result.map(|i| i.hosts)
}

#[test]
fn the_kept_state_and_inventory_equal_the_whole_build_after_any_walk() {
    for seed in 1..=40_u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (world, mut writers) = World::new(NS);
        let (mut states, mut inventories) = (StateCache::default(), InventoryCache::default());
        let settings = (ControllerSettings::default(), crate::kube::run::timing());
        for version in 1..=150 {
            step(&mut rng, &world, &mut writers, version);
            states.update(&world, &world.changes.take(Consumer::State));
            assert_eq!(
                kept_state(&states, &world),
                whole_state(&world),
                "seed {seed}, step {version}"
            );
            // The inventory is checked on its own tick: every few steps.
            if rng.below(3) == 0 {
                let changed = world.changes.take(Consumer::Inventory);
                let different = inventories.update(&world, CREDENTIALS, &changed);
                let kept =
                    inventory_of(inventories.inventory(&world, NS, &settings.0, &settings.1));
                let whole = inventory_of(world::inventory(
                    &world,
                    NS,
                    CREDENTIALS,
                    &settings.0,
                    &settings.1,
                ));
                assert_eq!(kept, whole, "seed {seed}, step {version}");
                if !different {
                    // Nothing the inventory reads changed: the same inventory as before.
                    assert!(changed.everything || !changed.policy);
                }
            }
        }
    }
}

#[test]
fn a_changed_node_reads_again_only_the_hosts_that_name_it() {
    let mut rng = Rng(7);
    let (world, mut writers) = World::new(NS);
    for i in 0..200 {
        let name = format!("w-{i:03}");
        let mut h = host(&mut rng, &name, 1);
        h.spec.node_name = name.clone();
        apply(&mut writers.hosts, h);
        apply(&mut writers.nodes, node(&mut rng, &name, 1));
    }
    let mut cache = StateCache::default();
    let first = cache.update(&world, &world.changes.take(Consumer::State));
    assert_eq!(first.visited, 200);
    let before = cache.state().changes.unwrap().revision();
    apply(&mut writers.nodes, node(&mut rng, "w-042", 2));
    let update = cache.update(&world, &world.changes.take(Consumer::State));
    assert_eq!(update.visited, 1);
    let changes = cache.state().changes.unwrap();
    assert_eq!(
        changes
            .changed_since(before)
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        ["w-042"]
    );
    assert_eq!(
        cache
            .update(&world, &world.changes.take(Consumer::State))
            .visited,
        0
    );
}
