-- Nexmark q3: local item suggestion. Who sells in category 10 in Oregon, Idaho or California:
-- auctions joined with their sellers (the generator's states are lower case, as RisingWave's).
--
-- Nexmark's join has no time bound, so its state grows with every person and auction. The
-- generator only ever picks a seller among the newest people (activePeople, 1,000, plus 10
-- ahead), who joined at most 1,010 people, about 50,500 events, before the auction. The bound
-- below says so in event time, for any firstEventRate of 10,000 events/s or more, so the
-- watermark evicts what can no longer match; the differential test checks the result equals
-- Nexmark's unbounded join over the same events (the batch run leaves the bound's line out).
SELECT p.name, p.city, p.state, a.id
FROM STREAM auction WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS a
JOIN STREAM person WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS p
  ON a.seller = p.id
 AND p.date_time BETWEEN a.date_time - INTERVAL 10 SECONDS AND a.date_time + INTERVAL 1 SECOND -- weir: streaming only
WHERE a.category = 10 AND (p.state = 'or' OR p.state = 'id' OR p.state = 'ca');
