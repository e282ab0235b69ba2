"""Node.js's connections list and its policy: the part every other part reads.

- ``records``: a connection's record, with its links (``Connection``);
- ``queues``: the intrusive queues and the heap the list keeps its records in;
- ``connections``: ``ConnectionsList``, Node's list: its events, counts and walks, the only
  reader of its links;
- ``views``: what the list shows (the states, the view's counts), asking the list;
- ``kinds``: the table of timeout and room kinds, and the settings;
- ``checks``: the options' checks and defaults;
- ``budget``: the connection budget's choice of what to close;
- ``sweep``: the steps of the one timer, in the order they run;
- ``timer``: the worker's one timer on the server's loop;
- ``enforcer``: the cuts, the totals, and what the servers' feeders call;
- ``handover``: where the worker's one enforcer passes from the middleware to the servers;
- ``logs``: what connlist writes to the log;
- ``version``: the package's version.

Nothing here imports a server, the ASGI side or an observer.
"""
