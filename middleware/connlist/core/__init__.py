"""Node.js's connections list and its policy: the part every other part reads.

- ``records``: a connection's record, with its links (``Connection``);
- ``queues``: the intrusive queues and the heap the list keeps its records in;
- ``connections``: ``ConnectionsList``, Node's list and its events;
- ``views``: what the list shows by walking it;
- ``kinds``: the table of timeout and room kinds, and the options' checks;
- ``budget``: the connection budget (``max_connections``, ``max_upgraded``);
- ``sweep``: the steps of the one timer, in the order they run;
- ``enforcer``: the worker's one timer, and the cuts;
- ``logs``: what connlist writes to the log.

Nothing here imports a server, the ASGI side or an observer.
"""
