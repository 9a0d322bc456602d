"""The operator's dashboard: server-rendered pages, their actions and the websockets that keep
them live (``consumers``). Reads go through ``sagas.selectors``, writes through
``sagas.services``, and ``accounts.access`` decides who may see or do what."""
