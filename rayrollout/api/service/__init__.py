"""The rollout API over HTTP: what the engine actor offers a training loop, for trainers that
cannot join the Ray cluster (another Ray, another Python): docs/how-to/service.md.

``actor`` is the detached ``service`` actor ``rayrollout up`` starts beside the engine;
``routes`` its HTTP routes; ``core`` what each call does (batches fed to the engine's
``stream`` within their bound, the training-loop calls forwarded); ``submit_rows`` the
checks of a submit's rows; ``batches`` a batch's rows by cursor and the registry of
batches; ``journal`` each batch's rows in the output folder, so a batch outlives its engine
and its service; ``engine_link`` the engine found by name, again after it died;
``nemo_gym_run`` NeMo Gym's ``POST /run``; ``bodies`` a request's body and cursor, read
before anything else touches them; ``openapi`` the routes as an OpenAPI description.
The wire format is ``rayrollout.client.models``, shared with the light client.

May import: the engine and everything below it (as the rest of ``api``), and
``rayrollout.client.models`` (the wire format); never the CLI.
"""
