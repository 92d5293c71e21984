"""The run and worker pages show the run-lease article's liveness states (issue 13, item 2)."""


def test_the_run_and_worker_pages_show_the_states(api_for, acme, viewer_client):
    client = api_for(acme)
    run_id = client.create_run()
    client.acquire(run_id, "agent-a")
    client.post("/workers/me/heartbeat", {})
    page = viewer_client.get(f"/runs/{run_id}/").content.decode()
    assert ">PROCESS_ALIVE</span>" in page and ">LEASE_VALID</span>" in page
    page = viewer_client.get(f"/workers/{acme.worker.pk}/").content.decode()
    assert ">PROCESS_ALIVE</span>" in page and "1 lease valid" in page


def test_the_worker_page_shows_its_boots_as_restart_episodes(api_for, acme, viewer_client):
    client = api_for(acme)
    ready = {"ok": True, "evidence": {}}
    readiness = dict.fromkeys(("runtime", "state", "credentials", "outbound_delivery", "admission"), ready)
    for n in range(3):
        body = {
            "boot_id": f"b{n}",
            "config_hash": f"cfg-{n}",
            "code_version": "v1",
            "state_schema_version": 1,
            "pid": 100 + n,
            "host": "node-1",
            "readiness": readiness,
        }
        assert client.post("/workers/me/boots", body).status == 201
    page = viewer_client.get(f"/workers/{acme.worker.pk}/").content.decode()
    assert "restart 2" in page and ">crash</span>" in page and "cfg-2 · v1" in page
    # One episode (three boots that never reached EXECUTING), counted the same way on the
    # worker page, in the workers list, and by the metric.
    assert "1 restart episode begun" in page
    listed = viewer_client.get("/workers/").content.decode()
    assert '<td data-label="restart episodes" class="num"><a href=' in listed and '#boots">1</a>' in listed
