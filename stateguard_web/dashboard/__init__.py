"""The operator's dashboard: server-rendered pages, their actions and the websockets that keep
them live (``consumers``). Reads go through ``runs.selectors``, writes through
``runs.services``, and ``accounts.access`` decides who may see or do what."""
