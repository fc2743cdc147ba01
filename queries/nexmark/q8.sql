-- Nexmark q8: monitor new users. People who opened an auction in the 10-second window in which
-- they joined.
-- weir: final: starttime + INTERVAL '10 seconds' <= :watermark
SELECT p.id, p.name, p.w['start'] AS starttime
FROM (
    SELECT id, name, window(date_time, '10 seconds') AS w
    FROM STREAM person WATERMARK date_time DELAY OF INTERVAL 4 SECONDS
    GROUP BY id, name, window(date_time, '10 seconds')
) p
JOIN (
    SELECT seller, window(date_time, '10 seconds') AS w
    FROM STREAM auction WATERMARK date_time DELAY OF INTERVAL 4 SECONDS
    GROUP BY seller, window(date_time, '10 seconds')
) a
  ON p.id = a.seller AND p.w = a.w;
