from harness.store.sql import SQLStore


def test_store_opens(sqlite_store: SQLStore) -> None:
    assert sqlite_store.list_runs() == []
