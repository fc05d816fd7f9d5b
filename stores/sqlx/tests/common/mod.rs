//! What the sqlx store suites of both engines share, written once: the store tests
//! whose steps are the same on PostgreSQL and MySQL/MariaDB, as a macro over the
//! engine's fixture (`store_suite!`). Each engine's file keeps only what is its own
//! (time zones, a shared table with tokio-postgres, the token sequence's upgrade).
//!
//! The fixture a file defines, named `Db`, gives: `Db::new(test) -> Option<Db>` (a
//! database or schema of the test's own with the schema ensured, `None` when the URL is
//! unset), `db.store` (a store over an 8-connection pool there), `db.another()` (a
//! store over a new pool there: another process, or a restart), `db.records()` (the
//! records table's qualified name), `db.execute(sql)` and `db.drop()`.

/// The shared store tests for one engine: `$store` the store type, `$needs` the
/// variable whose absence skips them, `$said` the start of the store's `Debug`, `$down`
/// a URL nothing answers at and `$named` how the error names it, `$unparsable` a URL
/// whose password holds an unescaped `@` and `/`, `$tag` the tiered
/// suite's key prefix, `$short_fingerprint` an assignment of a 3-byte fingerprint in
/// the engine's literal syntax.
#[macro_export]
macro_rules! store_suite {
    (store: $store:ty, needs: $needs:literal, said: $said:literal, down: $down:literal,
     named: $named:literal, unparsable: $unparsable:literal, tag: $tag:literal, short_fingerprint: $short:literal) => {
        use idemcache::store::conformance::{self, acquire, fp, key, LEASE, TTL};
        use idemcache::store::{OpenClaim, Store, StoreClaim, StoreError};
        use idemcache::LapsePolicy;

        #[tokio::test]
        #[ignore = $needs]
        async fn the_store_conforms() {
            let Some(db) = Db::new("conforms").await else { return };
            conformance::run(&db.store).await;
            // Twice on one table: every call keys its records apart.
            conformance::run(&db.store).await;
            // The schema again, on a database that has it: nothing changes.
            db.store.ensure_schema().await.unwrap();
            let said = format!("{:?}", db.store);
            assert!(said.starts_with($said), "{said}");
            db.drop().await;
        }

        #[tokio::test]
        #[ignore = $needs]
        async fn under_mark_unknown_a_lapsed_lease_never_runs_again() {
            let Some(db) = Db::new("lapse").await else { return };
            let ttl = std::time::Duration::from_secs(3600);
            let store =
                db.store.clone().with_lapse_policy(LapsePolicy::MarkUnknown { ttl }).unwrap();
            assert_eq!(store.lapse_policy(), LapsePolicy::MarkUnknown { ttl });
            conformance::run_mark_unknown(&store, ttl, true).await;
            conformance::reconcile_as_checked(&store).await;
            let zero = LapsePolicy::MarkUnknown { ttl: std::time::Duration::ZERO };
            let refused = db.store.clone().with_lapse_policy(zero);
            assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
            db.drop().await;
        }

        /// Two `Tiered` instances (separate caches, separate pools) over one database,
        /// hammered with concurrent duplicates: each key runs once; a restarted one
        /// replays.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = $needs]
        async fn two_tiered_instances_execute_each_key_exactly_once() {
            let Some(db) = Db::new("tiered").await else { return };
            let (second, restarted) = (db.another(), db.another());
            conformance::tiered_exactly_once(db.store.clone(), second, restarted, $tag).await;
            db.drop().await;
        }

        /// Sixteen claims of one absent key at once, from two pools (two processes'
        /// worth of connections): exactly one acquires.
        /// Sixteen claims of `k` at once, alternating between `first` and `second` (two
        /// processes' pools): their answers.
        async fn sixteen_claims(
            first: &$store,
            second: &$store,
            k: &idemcache::Key,
        ) -> Vec<StoreClaim> {
            let claims: Vec<_> = (0..16)
                .map(|i| {
                    let store = if i % 2 == 0 { first.clone() } else { second.clone() };
                    let k = k.clone();
                    tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await.unwrap() })
                })
                .collect();
            let mut answers = Vec::with_capacity(claims.len());
            for claim in claims {
                answers.push(claim.await.unwrap());
            }
            answers
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = $needs]
        async fn concurrent_claims_of_one_key_race_to_exactly_one_acquired() {
            let Some(db) = Db::new("race").await else { return };
            let other = db.another();
            for round in 0..4 {
                let k = key(&format!("race-{round}"));
                let mut acquired = 0;
                for answer in sixteen_claims(&db.store, &other, &k).await {
                    match answer {
                        StoreClaim::Acquired { .. } => acquired += 1,
                        StoreClaim::InProgress { .. } => {}
                        other => panic!("{other:?}"),
                    }
                }
                assert_eq!(acquired, 1, "round {round}: exactly one claim acquired");
            }
            db.drop().await;
        }

        /// A dead record (its lease ended a minute ago, as the server's clock has it)
        /// claimed by 16 at once from two pools: one takes it over under a new token,
        /// the rest find it in progress, and the dead lease's token is refused.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = $needs]
        async fn concurrent_claims_of_a_dead_record_race_to_exactly_one_takeover() {
            let Some(db) = Db::new("takeover").await else { return };
            let k = key("takeover");
            let stale = acquire(&db.store, &k).await;
            // The lease's end a minute in the past: the lease and a minute before the claim.
            let back = 60_000_000 + LEASE.as_micros();
            db.execute(format!("UPDATE {} SET expires_at = expires_at - {back}", db.records()))
                .await;
            let other = db.another();
            let mut fresh = Vec::new();
            for answer in sixteen_claims(&db.store, &other, &k).await {
                match answer {
                    StoreClaim::Acquired { token, took_over, .. } => {
                        assert!(took_over, "the dead record was PROCESSING");
                        fresh.push(token)
                    }
                    StoreClaim::InProgress { .. } => {}
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(fresh.len(), 1, "exactly one claim took the dead record over: {fresh:?}");
            assert!(fresh[0] > stale);
            let late = db.store.complete(&k, stale, None, TTL).await;
            assert!(matches!(late, Err(StoreError::LeaseLost(_))), "{late:?}");
            db.store.complete(&k, fresh[0], None, TTL).await.unwrap();
            db.drop().await;
        }

        /// An UNKNOWN row without its mark time and a fingerprint of the wrong length
        /// are `Corrupt` naming their key; named, the record can be forgotten.
        #[tokio::test]
        #[ignore = $needs]
        async fn rows_the_store_cannot_read_are_corrupt_not_a_panic() {
            let Some(db) = Db::new("corrupt").await else { return };
            let store = &db.store;
            let k = key("sqlx-no-mark");
            let token = acquire(store, &k).await;
            store.mark_unknown(&k, token, TTL).await.unwrap();
            db.execute(format!("UPDATE {} SET settled_at = NULL", db.records())).await;
            match store.list_unknown(10).await {
                Err(StoreError::Corrupt(why)) => assert!(why.contains("sqlx-no-mark"), "{why}"),
                other => panic!("expected Corrupt, got {other:?}"),
            }
            db.execute(format!("UPDATE {} SET {}", db.records(), $short)).await;
            match store.claim(&k, fp("r"), LEASE).await {
                Err(StoreError::Corrupt(why)) => {
                    assert!(why.contains("sqlx-no-mark") && why.contains("16 bytes"), "{why}")
                }
                other => panic!("expected Corrupt, got {other:?}"),
            }
            store.forget(&k).await.unwrap();
            assert!(store.list_unknown(10).await.unwrap().is_empty());
            db.drop().await;
        }

        /// `complete_in`: rolled back, the record stays PROCESSING; committed, it
        /// replays; a stale token is refused and its transaction can roll back.
        #[tokio::test]
        #[ignore = $needs]
        async fn a_completion_in_the_callers_transaction_commits_with_it() {
            let Some(db) = Db::new("in_tx").await else { return };
            let store = &db.store;
            let k = key("sqlx-in-tx");
            let token = acquire(store, &k).await;
            let claim = OpenClaim::new(k.clone(), token, TTL);

            let mut tx = store.pool().begin().await.unwrap();
            <$store>::complete_in(&mut tx, &claim, Some(b"paid")).await.unwrap();
            assert!(claim.handed_over());
            tx.rollback().await.unwrap();
            assert!(matches!(
                store.claim(&k, fp("r"), LEASE).await.unwrap(),
                StoreClaim::InProgress { .. }
            ));

            let mut tx = store.pool().begin().await.unwrap();
            let record = <$store>::complete_in(&mut tx, &claim, Some(b"paid")).await.unwrap();
            tx.commit().await.unwrap();
            match store.claim(&k, fp("r"), LEASE).await.unwrap() {
                StoreClaim::Completed(replay) => assert_eq!(replay, record),
                other => panic!("{other:?}"),
            }

            let stale = OpenClaim::new(k.clone(), token, TTL);
            let mut tx = store.pool().begin().await.unwrap();
            let refused = <$store>::complete_in(&mut tx, &stale, Some(b"again")).await;
            assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
            tx.rollback().await.unwrap();
            db.drop().await;
        }

        /// A server nothing answers at is a backend error naming it; a URL that does
        /// not parse is invalid input. Needs no server.
        #[tokio::test]
        async fn an_unreachable_server_is_a_typed_error_naming_it() {
            let store = <$store>::connect($down).await.unwrap();
            match store.claim(&key("down"), fp("r"), LEASE).await {
                Err(e @ StoreError::Backend(_)) => {
                    assert!(e.to_string().contains($named), "{e}")
                }
                other => panic!("expected a backend error, got {other:?}"),
            }
            let refused = <$store>::connect($unparsable).await;
            assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
        }
    };
}

/// The shared outbox tests for one engine: the scenarios of
/// `idemcache_sql::outbox::testing` and of its `producers` through this crate's
/// `Storage` of `$engine` (a module of `idemcache_sqlx::outbox`), and a claim that skips
/// a row another transaction holds. `$conn` is the engine's connection type and `$db`
/// its database, `$needs` the skip reason, and the statements in the engine's dialect
/// (`$1`/`?` the bound value): `$spoil` makes `bad-headers` and `bad-state` unreadable,
/// `$count` counts the rows in a state, `$session` is the connection's id, `$waiting`
/// counts a connection's lock waits, `$key_seqs` reads a key's `seq`s in order, `$sleep`
/// is a 1 ms sleep of the server's, `$raise` sets a column (`{}`) of a row to
/// `i64::MAX`.
///
/// The fixture a file defines, named `Db`, gives: `Db::new(test) -> Option<Db>` (a
/// database or schema of the test's own with the outbox ensured), `db.conn()` (a
/// connection there), `db.pool()` (a 4-connection pool there) and `db.drop()`.
#[macro_export]
macro_rules! outbox_suite {
    (engine: $engine:path, conn: $conn:ty, db: $db:ty, needs: $needs:literal,
     spoil: $spoil:literal, count: $count:literal, session: $session:literal,
     waiting: $waiting:literal, key_seqs: $key_seqs:literal, sleep: $sleep:literal,
     raise: $raise:literal) => {
        use idemcache_sql::outbox::testing::{self, ids, message, t0};
        use idemcache_sql::outbox::State;
        use idemcache_sqlx::outbox::OutboxMessage;
        use sqlx::{Connection, Executor};
        use $engine::{claim_due, enqueue, Storage};

        use idemcache_sql::one_commit::testing::Boxed;
        use idemcache_sql::outbox::testing::producers::{self, End, Producer, Producers, Script};

        const MIN: std::time::Duration = std::time::Duration::from_secs(60);

        /// Producers on connections of a pool of their own (16: six lanes, the relay
        /// and the observer at once), the relay's storage on the test's pool.
        #[derive(Clone)]
        struct Producing {
            storage: sqlx::Pool<$db>,
            producers: sqlx::Pool<$db>,
        }

        impl Producing {
            fn new(pool: &sqlx::Pool<$db>) -> Producing {
                let options = (*pool.connect_options()).clone();
                let producers =
                    sqlx::pool::PoolOptions::new().max_connections(16).connect_lazy_with(options);
                Producing { storage: pool.clone(), producers }
            }
        }

        impl Producers for Producing {
            type Storage = Storage;

            fn storage(&self) -> Storage {
                Storage::new(self.storage.clone())
            }

            fn producer(&self, script: Script) -> Boxed<'_, Producer> {
                Box::pin(async move {
                    let mut conn = self.producers.acquire().await.unwrap();
                    let session = sqlx::query_scalar($session).fetch_one(&mut *conn).await;
                    let session: i64 = session.unwrap();
                    let done = tokio::spawn(async move {
                        let mut tx = Connection::begin(&mut *conn).await.unwrap();
                        let mut enqueued = Ok(());
                        for m in &script.messages {
                            enqueued = enqueue(&mut tx, m).await;
                            if enqueued.is_err() {
                                break;
                            }
                        }
                        let failed = enqueued.is_err();
                        let _ = script.enqueued.send(enqueued);
                        if !failed {
                            tx.execute($sleep).await.unwrap();
                        }
                        match script.end.await {
                            Ok(End::Commit) if !failed => tx.commit().await.unwrap(),
                            _ => tx.rollback().await.unwrap(),
                        }
                    });
                    Producer { session, done }
                })
            }

            fn waiting(&self, session: i64) -> Boxed<'_, bool> {
                Box::pin(async move {
                    let waits = sqlx::query_scalar::<_, i64>($waiting).bind(session);
                    waits.fetch_one(&self.storage).await.unwrap() > 0
                })
            }

            fn key_seqs(&self, key: &'static str) -> Boxed<'_, Vec<i64>> {
                Box::pin(async move {
                    let seqs = sqlx::query_scalar($key_seqs).bind(key);
                    seqs.fetch_all(&self.storage).await.unwrap()
                })
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = $needs]
        async fn producers_side_by_side_keep_each_keys_order_and_hold_back_no_other() {
            let Some(db) = Db::new("side_by_side").await else { return };
            producers::run(&Producing::new(&db.pool().await)).await;
            db.drop().await;
        }

        #[tokio::test]
        #[ignore = $needs]
        async fn a_row_at_the_top_of_its_counters_does_not_stall_the_claim() {
            let Some(db) = Db::new("top").await else { return };
            let d = &db;
            let put = move |messages| put_into(d, messages);
            let raise = move |column: &'static str, id: String| async move {
                let set = format!($raise, column);
                let raised = sqlx::query(sqlx::AssertSqlSafe(set)).bind(id);
                raised.execute(&mut d.conn().await).await.unwrap();
            };
            let pool = db.pool().await;
            let storage = Storage::new(pool.clone());
            producers::a_row_at_the_top_of_its_counters_does_not_stall_the_claim(
                &storage, put, raise,
            )
            .await;
            pool.close().await;
            db.drop().await;
        }

        #[tokio::test]
        #[ignore = $needs]
        async fn the_largest_headers_check_accepts_are_read_back_as_enqueued() {
            let Some(db) = Db::new("headers").await else { return };
            let d = &db;
            let put = move |messages| put_into(d, messages);
            let pool = db.pool().await;
            let storage = Storage::new(pool.clone());
            testing::the_largest_headers_check_accepts_are_read_back_as_enqueued(&storage, put)
                .await;
            pool.close().await;
            db.drop().await;
        }

        /// Enqueues `messages` in one committed transaction on `c`.
        async fn put(c: &mut $conn, messages: &[OutboxMessage]) {
            let mut tx = c.begin().await.unwrap();
            for m in messages {
                enqueue(&mut tx, m).await.unwrap();
            }
            tx.commit().await.unwrap();
        }

        /// Enqueues `messages` in one committed transaction, on a connection of `db`'s.
        async fn put_into(db: &Db, messages: Vec<OutboxMessage>) {
            put(&mut db.conn().await, &messages).await;
        }

        #[tokio::test]
        #[ignore = $needs]
        async fn enqueue_commits_with_the_change_byte_for_byte() {
            let Some(db) = Db::new("basic").await else { return };
            let d = &db;
            let put = move |messages| put_into(d, messages);
            let rolled_back = move |m: OutboxMessage| async move {
                let mut c = d.conn().await;
                let mut tx = c.begin().await.unwrap();
                let enqueued = enqueue(&mut tx, &m).await;
                tx.rollback().await.unwrap();
                enqueued
            };
            let pool = db.pool().await;
            let storage = Storage::new(pool.clone());
            testing::enqueue_commits_with_the_change_byte_for_byte(&storage, put, rolled_back)
                .await;
            pool.close().await;
            db.drop().await;
        }

        #[tokio::test]
        #[ignore = $needs]
        async fn leases_lapse_to_a_higher_token_keys_keep_order_failures_die_and_purge() {
            let Some(db) = Db::new("life").await else { return };
            let pool = db.pool().await;
            let d = &db;
            let put = move |messages| put_into(d, messages);
            testing::a_rows_life(&Storage::new(pool.clone()), put).await;
            pool.close().await;
            db.drop().await;
        }

        #[tokio::test]
        #[ignore = $needs]
        async fn a_poison_message_dies_alone() {
            let Some(db) = Db::new("poison").await else { return };
            let pool = db.pool().await;
            let d = &db;
            let put = move |messages| put_into(d, messages);
            testing::a_poison_message_dies_alone(&Storage::new(pool.clone()), put).await;
            pool.close().await;
            db.drop().await;
        }

        #[tokio::test]
        #[ignore = $needs]
        async fn unreadable_rows_are_corrupt_and_do_not_block_the_others() {
            let Some(db) = Db::new("corrupt").await else { return };
            let pool = db.pool().await;
            let d = &db;
            let put = move |messages| put_into(d, messages);
            let spoil = || async {
                d.conn().await.execute(sqlx::raw_sql($spoil)).await.unwrap();
            };
            let storage = Storage::new(pool.clone());
            testing::unreadable_rows_are_corrupt_and_hold_back_no_other(&storage, put, spoil).await;
            pool.close().await;
            db.drop().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = $needs]
        async fn concurrent_relays_never_lease_one_row_nor_hold_up_an_enqueue() {
            let Some(db) = Db::new("skip").await else { return };
            let pool = db.pool().await;
            let d = &db;
            let put = move |messages| put_into(d, messages);
            testing::concurrent_relays_never_lease_one_row_nor_hold_up_an_enqueue(
                || Storage::new(pool.clone()),
                put,
            )
            .await;
            pool.close().await;
            db.drop().await;
        }

        /// A row another transaction holds (`FOR UPDATE`) is skipped, not waited on; the
        /// rows of its key behind it wait for it.
        #[tokio::test]
        #[ignore = $needs]
        async fn a_claim_skips_a_row_another_transaction_holds_instead_of_waiting() {
            let Some(db) = Db::new("held").await else { return };
            let mut c = db.conn().await;
            let k = |id: &str| message(id).with_aggregate_key("K");
            put(&mut c, &[k("held"), k("after-held"), message("free")]).await;
            let mut holder = db.conn().await;
            let mut tx = holder.begin().await.unwrap();
            sqlx::query("SELECT 1 FROM idemcache_outbox WHERE message_id = 'held' FOR UPDATE")
                .execute(&mut *tx)
                .await
                .unwrap();
            // A bound on a hang, not a timing: the claim answers at once or the test fails.
            let claim = claim_due(&mut c, 10, MIN, t0());
            let guard = std::time::Duration::from_secs(10);
            let batch = tokio::time::timeout(guard, claim).await.expect("the claim waited");
            assert_eq!(ids(&batch.unwrap()), ["free"], "the held row skipped, its key waits");
            tx.rollback().await.unwrap();
            assert_eq!(ids(&claim_due(&mut c, 10, MIN, t0()).await.unwrap()), ["held"]);
            db.drop().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = $needs]
        async fn a_relay_killed_mid_batch_loses_nothing() {
            let Some(db) = Db::new("killed").await else { return };
            let mut c = db.conn().await;
            put(&mut c, &testing::killed_mid_batch_messages()).await;
            let pool = db.pool().await;
            let storage = || Storage::new(pool.clone());
            let count = |state: State| {
                let pool = &pool;
                async move {
                    let count = sqlx::query_scalar::<_, i64>($count).bind(state.code());
                    count.fetch_one(pool).await.unwrap()
                }
            };
            testing::a_relay_killed_mid_batch_loses_nothing(storage, count).await;
            pool.close().await;
            db.drop().await;
        }
    };
}
